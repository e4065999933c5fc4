"""The stale-gradient probe: its two measures against hand-computed numbers, and a real (one-round) run in which a
gradient taken 0 updates late is the fresh one and one taken late is not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from experiments.plain_ppo import train
from experiments.stale_gradient import closeness, extrapolated, quarter_medians, train_late


def test_closeness_is_the_cosine_and_the_relative_error() -> None:
    fresh = torch.tensor([3.0, 4.0])
    cosine, error = closeness(fresh, torch.tensor([4.0, 3.0]))
    assert cosine == pytest.approx(24 / 25)
    assert error == pytest.approx(math.sqrt(2) / 5)
    assert closeness(fresh, fresh) == (pytest.approx(1.0), 0.0)
    with pytest.raises(ValueError, match="fresh gradient is zero"):
        closeness(torch.zeros(2), fresh)


def test_extrapolation_moves_along_the_last_update() -> None:
    moved = extrapolated(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]), 3)
    assert moved.tolist() == [2.5, 0.5]
    assert extrapolated(torch.tensor([1.0]), torch.tensor([0.0]), 0).tolist() == [1.0]


def test_a_gradient_taken_late_differs_from_the_fresh_one_and_one_on_time_does_not() -> None:
    (on_time,) = train_late("Hopper-v5", rounds=1, seed=1, delay=0)
    assert on_time.cos_stale == pytest.approx(1.0) and on_time.err_stale == 0.0
    (late,) = train_late("Hopper-v5", rounds=1, seed=1, delay=3)
    assert late.cos_stale < 1.0 and late.err_stale > 0.0
    # Another minibatch's gradient is farther from this one's than the late one: the yardstick is not degenerate.
    assert late.err_other > late.err_stale and late.cos_other < late.cos_stale
    assert late.episodes > 0 and late.train_reward_mean > 0


def test_quarters_cover_the_rounds_in_order() -> None:
    rows = train_late("Hopper-v5", rounds=1, seed=2, delay=1)
    ((first, last, summary),) = quarter_medians(rows)
    assert (first, last) == (1, 1) and summary.cos_stale == rows[0].cos_stale
    with pytest.raises(ValueError, match="delay must be >= 0"):
        train_late("Hopper-v5", rounds=1, seed=1, delay=-1)


def test_on_time_without_comparisons_is_the_plain_loop_to_the_digit() -> None:
    plain = train("Hopper-v5", rounds=2, seed=3)
    (first, second) = train_late("Hopper-v5", rounds=2, seed=3, delay=0, compare=False)
    assert [first.train_reward_mean, second.train_reward_mean] == [float(np.mean(r.episode_returns)) for r in plain]
    assert math.isnan(first.cos_stale)
    # Applying the look-ahead gradient changes the run (its second round's episodes differ).
    (_, moved) = train_late("Hopper-v5", rounds=2, seed=3, delay=2, compare=False, apply_lookahead=True)
    (_, stale) = train_late("Hopper-v5", rounds=2, seed=3, delay=2, compare=False)
    assert moved.train_reward_mean != stale.train_reward_mean
