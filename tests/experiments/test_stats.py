"""The statistics over seeds (experiments/stats.py) against hand-computed numbers and rliable's own definitions."""

from __future__ import annotations

import numpy as np
import pytest
from rliable import metrics

from experiments import stats


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    # 8 runs: the middle 50 % are 3, 4, 5, 6 (the lowest and highest two dropped)
    assert stats.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    # an outlier does not move it: the middle half of 1..7 and 1000 is 3..6 still
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 1000]) == pytest.approx(4.5)


def test_iqm_pools_runs_over_tasks_as_rliable_does() -> None:
    scores = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])  # 4 runs × 2 tasks
    assert stats.iqm(scores) == pytest.approx(float(metrics.aggregate_iqm(scores)))
    # by hand: the 8 pooled scores 1 2 3 4 10 20 30 40, middle half 3 4 10 20
    assert stats.iqm(scores) == pytest.approx(9.25)


def test_intervals_hold_the_point_and_are_seeded() -> None:
    rng = np.random.default_rng(3)
    scores = {"a": rng.normal(100, 10, size=10), "b": rng.normal(50, 10, size=10)}
    first = stats.iqm_intervals(scores, reps=500)
    again = stats.iqm_intervals(scores, reps=500)
    assert first == again  # a rebuilt report gives the same numbers
    for iv in first.values():
        assert iv.low <= iv.point <= iv.high and iv.level == 0.95
    assert first["a"].above(first["b"]) and not first["b"].above(first["a"])


def test_one_run_has_no_spread() -> None:
    iv = stats.iqm_intervals({"x": [7.0]}, reps=100)["x"]
    assert (iv.low, iv.point, iv.high) == (7.0, 7.0, 7.0)


def test_probability_of_improvement_by_hand() -> None:
    # pairs (x, y): (1, 2) (1, 2) (3, 2) (3, 2): two wins of four -> 0.5; ties count half: (2, 2) -> 0.5
    assert stats.probability_of_improvement([1, 3], [2, 2], reps=200).point == pytest.approx(0.5)
    assert stats.probability_of_improvement([2, 2], [2, 2], reps=200).point == pytest.approx(0.5)
    dominant = stats.probability_of_improvement([10, 11, 12], [1, 2, 3], reps=200)
    assert (dominant.point, dominant.low, dominant.high) == (1.0, 1.0, 1.0)


def test_performance_profile_by_hand() -> None:
    # 4 runs of one task: the fraction above τ = 0, 2.5, 10 is 1, 0.5, 0
    profile = stats.performance_profile({"m": [1.0, 2.0, 3.0, 4.0]}, [0.0, 2.5, 10.0], reps=200)
    frac, low, high = profile["m"]
    assert frac.tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert np.all(low <= frac) and np.all(frac <= high)


def test_bad_scores_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="finite"):
        stats.iqm([1.0, float("nan")])
    with pytest.raises(ValueError, match="runs × tasks"):
        stats.iqm(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="same tasks"):
        stats.probability_of_improvement(np.zeros((3, 2)), np.zeros((3, 1)))


def test_a_curve_is_the_iqm_at_each_point() -> None:
    curves = np.array([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0], [3.0, 40.0]])  # 4 runs × 2 points
    point, low, high = stats.iqm_curve(curves, reps=200)
    assert point.tolist() == pytest.approx([1.5, 25.0])  # the middle two runs at each point
    assert np.all(low <= point) and np.all(point <= high)
