"""Proportional prioritised replay (Schaul et al. 2016): P(i) = p_i^α / Σ_k p_k^α, sampled with replacement, and
importance weights w_i = (N·P(i))^−β / max_j w_j over the N held entries. Priorities come from learner outputs
(functions/algos/replay_priority.py); a new entry gets the highest priority seen so far."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cache.replay.pattern import ReplayPattern, Sample
from cache.replay.store import ReplayEntry


def priority_probabilities(priorities: Sequence[float], *, alpha: float) -> np.ndarray:
    """P(i) = p_i^α / Σ_k p_k^α (α = 0: uniform)."""
    p = np.asarray(priorities, dtype=np.float64)
    if p.size == 0 or not np.all(p > 0):
        raise ValueError(f"priorities must be positive, got {p.tolist()}")
    scaled = p**alpha
    return scaled / scaled.sum()


def importance_weights(probabilities: np.ndarray, *, beta: float) -> np.ndarray:
    """w_i = (N·P(i))^−β, normalised by the largest (that of the least likely entry) so that w ≤ 1."""
    w = (len(probabilities) * probabilities) ** (-beta)
    return w / w.max()


class Prioritized(ReplayPattern):
    name = "prioritized"
    prioritized = True

    def choose(self, entries: Sequence[ReplayEntry], n: int, rng: np.random.Generator) -> Sample:
        probs = priority_probabilities([e.priority or 1.0 for e in entries], alpha=self.settings.replay_alpha)
        weights = importance_weights(probs, beta=self.settings.replay_beta)
        picks = rng.choice(len(entries), size=n, replace=True, p=probs)
        return Sample(tuple(entries[int(i)].rid for i in picks), tuple(float(weights[int(i)]) for i in picks))

    def update_priorities(self, priorities: Mapping[str, float]) -> int:
        return 0 if self.store is None else self.store.update_priorities(priorities)
