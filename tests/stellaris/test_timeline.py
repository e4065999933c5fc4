"""timeline.csv: each episode at its own end on the run's clock, with the run's env steps at that moment, from the
episode ends and collection spans that actors put in their batch headers. Hand-computed cases."""

from __future__ import annotations

import numpy as np

from cache import BatchMeta
from functions.actor.rollout import EpisodeTracker
from stellaris.rundir.outputs import TIMELINE_COLUMNS
from stellaris.rundir.report import timeline_rows


def _batch(steps: int, span: tuple[float, float] | None, ends: list[float], returns: list[float]) -> tuple:
    info: dict = {"episode_returns": returns}
    if span is not None:
        info |= {"collect_span": list(span), "episode_end_times": ends}
    return "id", BatchMeta(actor_id="a", behaviour_version=0, env_steps=steps, info=info)


def test_episodes_are_placed_at_their_own_end_with_the_runs_env_steps_then() -> None:
    # Two actors' batches of 100 steps over [10, 20] and [12, 22] (unix s); the run is at 50 s at unix 30.
    a = _batch(100, (10.0, 20.0), [15.0, 20.0], [5.0, 7.0])
    b = _batch(100, (12.0, 22.0), [17.0], [3.0])
    rows = timeline_rows([a, b], steps_before=1000, now_s=50.0, now_unix=30.0)
    assert list(rows[0]) == TIMELINE_COLUMNS
    assert rows == [
        {"wall_clock_s": 35.0, "env_steps": 1000 + 50 + 30, "episodic_reward": 5.0},  # a half, b 3/10 done
        {"wall_clock_s": 37.0, "env_steps": 1000 + 70 + 50, "episodic_reward": 3.0},
        {"wall_clock_s": 40.0, "env_steps": 1000 + 100 + 80, "episodic_reward": 7.0},
    ]


def test_an_actor_clock_ahead_is_clamped_and_a_header_without_ends_is_stamped_now() -> None:
    ahead = _batch(10, (25.0, 40.0), [40.0], [1.0])  # ends "after" now: placed now, its batch whole
    old = _batch(50, None, [], [9.0])
    rows = timeline_rows([ahead, old], steps_before=0, now_s=50.0, now_unix=30.0)
    assert rows == [
        {"wall_clock_s": 50.0, "env_steps": 10 * 5 // 15 + 50, "episodic_reward": 1.0},  # 5 of its 15 s by unix 30
        {"wall_clock_s": 50.0, "env_steps": 53, "episodic_reward": 9.0},
    ]


def test_the_tracker_records_the_step_each_episode_ended_in() -> None:
    tracker = EpisodeTracker.for_envs(2)
    rewards = np.ones((3, 2))
    done = np.array([[False, True], [False, False], [True, False]])
    tracker.step(rewards, done)
    assert tracker.take_with_steps() == ([1.0, 3.0], [1, 3], [1, 3])
    assert tracker.take_with_steps() == ([], [], [])
