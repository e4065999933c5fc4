"""The one interface of the replay patterns: `ReplayPattern` adds a round's landed batches to the store, samples
the batches a round replays, and takes priority updates. The choice of what to replay is a pure function of the
held entries and a seeded generator (`choose`); the store does the I/O."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cache.replay.store import ReplayEntry, ReplayStore
from contract.replay import ReplayName, ReplaySettings


@dataclass(frozen=True)
class Sample:
    """Replay ids to train on this round and the importance weight of each (1.0 but for prioritized replay)."""

    ids: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()


class ReplayPattern:
    """Base: writes nothing and replays nothing. Subclasses choose (`choose`) from the store's entries."""

    name: ClassVar[ReplayName] = "full_batch"
    prioritized: ClassVar[bool] = False

    def __init__(self, store: ReplayStore | None, settings: ReplaySettings, *, seed: int = 0) -> None:
        self.store, self.settings, self.seed = store, settings, seed

    def add(self, batches: Sequence[tuple[str, str]]) -> int:
        """Copy the round's landed batches, (stream id, actor id) each, into the store; returns entries evicted."""
        if self.store is None:
            return 0
        return sum(self.store.add(bid, actor).evicted for bid, actor in batches)

    def sample(self, n: int, *, round_k: int, exclude: Collection[str] = ()) -> Sample:
        """Up to `n` replay ids, none of `exclude` (the round's fresh batches), drawn with a generator seeded by
        (seed, round): the same run replays the same batches."""
        if self.store is None or n <= 0:
            return Sample()
        entries = [e for e in self.store.entries() if e.rid not in exclude]
        if not entries:
            return Sample()
        return self.choose(entries, n, np.random.default_rng([self.seed, round_k]))

    def choose(self, entries: Sequence[ReplayEntry], n: int, rng: np.random.Generator) -> Sample:
        return Sample()

    def update_priorities(self, priorities: Mapping[str, float]) -> int:
        """Priority updates from learner outputs; only prioritized replay keeps them."""
        return 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the pattern's own memory beside the store (fifo: its cursors)."""
        return {}

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take back a checkpoint's `state()`."""


def replay_count(fresh: int, ratio: float, carry: float = 0.0) -> tuple[int, float]:
    """How many batches a round with `fresh` fresh batches replays so that replayed/(fresh+replayed) = ratio on
    average: R = fresh·ratio/(1−ratio) plus the carried remainder, rounded down; returns (R, new remainder)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"replay_ratio must be in [0, 1), got {ratio}")
    target = fresh * ratio / (1.0 - ratio) + carry
    n = int(target + 1e-9)  # 1e-9: 0.5/0.5 + 0 is exactly 1, but not always in floating point
    return n, max(0.0, target - n)
