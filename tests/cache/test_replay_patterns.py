"""The replay patterns' pure choices against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cache.replay import ReplayEntry, ReplaySettings, is_replay_id, replay_id
from cache.replay.fifo import fifo_choice
from cache.replay.pattern import replay_count
from cache.replay.prioritized import Prioritized, importance_weights, priority_probabilities
from cache.replay.uniform import uniform_choice
from functions.algos.replay_priority import batch_priorities, priorities_of, replay_priority_stats


def entries(priorities: list[float] | None = None, actors: str = "aaaa") -> list[ReplayEntry]:
    ps = priorities or [1.0] * len(actors)
    return [ReplayEntry(f"r{i}-0", actor, i + 1, 100, p) for i, (actor, p) in enumerate(zip(actors, ps, strict=True))]


def test_priority_probabilities_and_weights_by_hand() -> None:
    # p = [1, 4, 9], α = 0.5: p^α = [1, 2, 3], P = [1/6, 2/6, 3/6].
    probs = priority_probabilities([1.0, 4.0, 9.0], alpha=0.5)
    np.testing.assert_allclose(probs, [1 / 6, 2 / 6, 3 / 6])
    # β = 1: w = (N·P)^-1 = [2, 1, 2/3], over the largest (2): [1, 0.5, 1/3].
    np.testing.assert_allclose(importance_weights(probs, beta=1.0), [1.0, 0.5, 1 / 3])
    # β = 0.5: w = [√2, 1, √(2/3)] / √2.
    np.testing.assert_allclose(importance_weights(probs, beta=0.5), [1.0, 1 / np.sqrt(2), np.sqrt(1 / 3)])
    np.testing.assert_allclose(priority_probabilities([1.0, 4.0], alpha=0.0), [0.5, 0.5])  # α = 0: uniform
    with pytest.raises(ValueError, match="positive"):
        priority_probabilities([1.0, 0.0], alpha=0.6)


def test_prioritized_sampling_follows_the_probabilities() -> None:
    pattern = Prioritized(None, ReplaySettings(replay="prioritized", replay_alpha=1.0, replay_beta=1.0))
    held = entries([1.0, 3.0], actors="ab")  # P = [1/4, 3/4]; weights [1, 1/3]
    sample = pattern.choose(held, 4000, np.random.default_rng(0))
    share = sample.ids.count("r1-0") / 4000
    assert abs(share - 0.75) < 0.03  # 0.03 is > 4 standard deviations (√(0.75·0.25/4000) ≈ 0.007)
    weights = {rid: w for rid, w in zip(sample.ids, sample.weights, strict=True)}
    assert weights == pytest.approx({"r0-0": 1.0, "r1-0": 1 / 3})  # (2·P)^-1 = [2, 2/3], over the largest
    again = pattern.choose(held, 4000, np.random.default_rng(0))
    assert again == sample  # seeded: the same run replays the same batches


def test_uniform_choice_is_distinct_and_uniform() -> None:
    held = entries(actors="abcd")
    counts = dict.fromkeys([e.rid for e in held], 0)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        ids = uniform_choice(held, 2, rng)
        assert len(set(ids)) == 2
        for rid in ids:
            counts[rid] += 1
    # Each of 4 entries is in a 2-subset with probability 1/2: 1000 of 2000 draws (std ≈ 22).
    assert all(abs(c - 1000) < 100 for c in counts.values()), counts
    assert len(uniform_choice(held, 9, rng)) == 4  # never more than held


def test_fifo_choice_round_robin_from_the_cursor_by_hand() -> None:
    # a: seqs 1, 3, 5; b: 2, 4 (entries(): seq = index + 1). Cursor a at 3: a's queue is 5, 1, 3; b's 2, 4.
    held = entries(actors="ababa")
    ids, cursors = fifo_choice(held, 4, {"a": 3})
    assert ids == ("r4-0", "r1-0", "r0-0", "r3-0")  # a5, b2, a1, b4
    assert cursors == {"a": 1, "b": 4}


def test_replay_count_hits_the_ratio_on_average() -> None:
    assert replay_count(2, 0.5) == (2, 0.0)  # half fresh, half replayed
    n, carry = replay_count(1, 0.25)  # 1/3 of a batch owed
    assert n == 0 and carry == pytest.approx(1 / 3)
    total, carry = 0, 0.0
    for _ in range(9):
        n, carry = replay_count(1, 0.25, carry)
        total += n
    assert total == 3  # 3 replayed / (9 fresh + 3) = 0.25
    with pytest.raises(ValueError, match="replay_ratio"):
        replay_count(1, 1.0)


def test_batch_priorities_are_mean_abs_advantage_per_batch() -> None:
    adv = torch.tensor([[1.0, -3.0, 2.0], [-1.0, 1.0, -4.0]])  # [T=2, N=3]; batch 0 owns column 0, batch 1 the rest
    assert batch_priorities(adv, [1, 2], eps=0.0) == [1.0, 2.5]  # |1|,|-1| -> 1; |-3|,|2|,|1|,|-4| -> 2.5
    with pytest.raises(ValueError, match="columns"):
        batch_priorities(adv, [1, 1])
    cfg = ReplaySettings(replay="prioritized")
    batches = [{"rewards": np.zeros((2, 1))}, {"rewards": np.zeros((2, 2))}]
    stats = replay_priority_stats(cfg, adv, batches)
    assert priorities_of(stats | {"loss": 0.3}, ("5-0", "r4-0")) == pytest.approx({"5-0": 1.0, "r4-0": 2.5}, 1e-5)
    assert replay_priority_stats(ReplaySettings(replay="uniform"), adv, batches) == {}


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match="replay_ratio"):
        ReplaySettings(replay_ratio=1.0)
    with pytest.raises(ValueError, match="replay\n"):
        ReplaySettings(replay="lifo")  # type: ignore[arg-type]
    spec = {"algo": {"lr": 1e-3, "replay": "uniform", "replay_capacity": 8}}
    assert ReplaySettings.of_spec(spec) == ReplaySettings(replay="uniform", replay_capacity=8)
    assert ReplaySettings.of_spec({"algo": {"lr": 1e-3}}).replay == "full_batch"  # PPO: no replay fields


def test_a_replay_id_is_r_and_a_stream_id() -> None:
    assert replay_id("1712-0") == "r1712-0" and replay_id("r1712-0") == "r1712-0"
    assert is_replay_id("r1712-0")
    # Ids that only start with r are not replay ids: an actor's batch id in gradients_at_actors, say.
    assert not is_replay_id("1712-0") and not is_replay_id("runner-3-ab12") and not is_replay_id("r")
