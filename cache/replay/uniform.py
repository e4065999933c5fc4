"""Uniform replay: a bounded ring (oldest evicted first), sampled uniformly without replacement."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache.replay.pattern import ReplayPattern, Sample
from cache.replay.store import ReplayEntry


def uniform_choice(entries: Sequence[ReplayEntry], n: int, rng: np.random.Generator) -> tuple[str, ...]:
    """min(n, len(entries)) distinct entries, each subset of that size equally likely."""
    k = min(n, len(entries))
    return tuple(entries[int(i)].rid for i in rng.choice(len(entries), size=k, replace=False))


class Uniform(ReplayPattern):
    name = "uniform"

    def choose(self, entries: Sequence[ReplayEntry], n: int, rng: np.random.Generator) -> Sample:
        ids = uniform_choice(entries, n, rng)
        return Sample(ids, (1.0,) * len(ids))
