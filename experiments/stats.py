"""Statistics over seeds, by rliable (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"): the
interquartile mean (IQM) with stratified-bootstrap 95 % confidence intervals, performance profiles and the
probability of improvement. Arrays in, numbers out; no I/O (docs/results/index.md says how they are read).

Scores are arranged as rliable wants them: one matrix per method, `runs × tasks` (a task here is an env, its returns
normalised by the caller when envs are pooled). The bootstrap is seeded, so a report rebuilt from the same CSVs gives
the same intervals.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from rliable import library as rly
from rliable import metrics
from scipy import stats as scipy_stats

Scores = Sequence[float] | Sequence[Sequence[float]] | np.ndarray  # runs, or runs × tasks
REPS = 2000  # bootstrap replications: the intervals' third digit settles by here on 5-15 runs
SEED = 0  # the bootstrap's random state: a rebuilt report is identical


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval (`level`: its coverage)."""

    point: float
    low: float
    high: float
    level: float = 0.95

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def above(self, other: Interval) -> bool:
        """Better beyond the interval: this one's low end above the other's high end."""
        return self.low > other.high


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """rliable's stratified bootstrap draws its indices from NumPy's global state, whatever random state it is given:
    seed that, and give the caller's back."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


def _matrix(scores: Scores) -> np.ndarray:
    """Runs × tasks: a flat list of runs is one task."""
    m = np.asarray(scores, dtype=float)
    if m.ndim == 1:
        m = m[:, None]
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"scores must be runs × tasks, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError("scores must be finite (a run without a score is left out by the caller)")
    return m


def iqm(scores: Scores) -> float:
    """The interquartile mean: the mean of the middle 50 % of all runs' scores, pooled over tasks."""
    return float(metrics.aggregate_iqm(_matrix(scores)))


def iqm_intervals(
    scores: Mapping[str, Scores], *, reps: int = REPS, level: float = 0.95, seed: int = SEED
) -> dict[str, Interval]:
    """Each method's IQM with its stratified-bootstrap interval (runs resampled within each task)."""
    data = {name: _matrix(s) for name, s in scores.items()}
    with _seeded(seed):
        points, intervals = rly.get_interval_estimates(
            data, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps, confidence_interval_size=level
        )
    return {
        name: Interval(float(points[name][0]), float(intervals[name][0, 0]), float(intervals[name][1, 0]), level)
        for name in data
    }


def iqm_curve(
    curves: Scores, *, reps: int = REPS, level: float = 0.95, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A learning curve's IQM over runs at each point (runs × points, on a common grid), with its band: one bootstrap
    for the whole curve, runs resampled within each point. Returns (IQM, low, high), one value per point."""
    m = _matrix(curves)
    with _seeded(seed):
        points, intervals = rly.get_interval_estimates(
            {"c": m}, lambda x: scipy_stats.trim_mean(x, 0.25, axis=0), reps=reps, confidence_interval_size=level
        )
    return np.asarray(points["c"]), np.asarray(intervals["c"][0]), np.asarray(intervals["c"][1])


def probability_of_improvement(x: Scores, y: Scores, *, reps: int = REPS, seed: int = SEED) -> Interval:
    """P(X > Y): the chance that a run of X beats a run of Y on a task picked at random (ties count half), with its
    bootstrap interval. Both are runs × tasks over the same tasks."""
    mx, my = _matrix(x), _matrix(y)
    if mx.shape[1] != my.shape[1]:
        raise ValueError(f"X has {mx.shape[1]} tasks, Y {my.shape[1]}: compare them on the same tasks")
    with _seeded(seed):
        points, intervals = rly.get_interval_estimates(
            {"xy": (mx, my)}, lambda a, b: np.array([metrics.probability_of_improvement(a, b)]), reps=reps
        )
    return Interval(float(points["xy"][0]), float(intervals["xy"][0, 0]), float(intervals["xy"][1, 0]))


def performance_profile(
    scores: Mapping[str, Scores],
    thresholds: Sequence[float] | np.ndarray,
    *,
    reps: int = REPS,
    seed: int = SEED,
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each method, the fraction of runs scoring above each threshold τ, with its interval: (fraction, low, high),
    one value per threshold."""
    data = {name: _matrix(s) for name, s in scores.items()}
    taus = np.asarray(thresholds, dtype=float)
    with _seeded(seed):  # rliable's own `create_performance_profile`, with its bootstrap seeded
        points, intervals = rly.get_interval_estimates(data, lambda x: rly.score_distributions(x, taus), reps=reps)
    return {name: (np.asarray(points[name]), intervals[name][0], intervals[name][1]) for name in data}
