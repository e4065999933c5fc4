"""Summary numbers from run directories, against hand-computed values."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from experiments.suites import RunPlan
from experiments.summary import final_reward, run_result, summarise, time_to_reward, window_reward, write_outputs
from stellaris.rundir.outputs import INFO_COLUMNS


def _row(round_id: int, reward: float, episodes: int, cost: float) -> dict[str, float]:
    row = {c: 0.0 for c in INFO_COLUMNS}
    row |= {
        "round_id": round_id,
        "duration": 2.0,
        "episodes": episodes,
        "train_reward_mean": reward,
        "cost": cost,
        "cost_learner": cost * 0.75,
        "cost_actor": cost * 0.25,
        "env_steps": 100 * round_id,
        "actor_time": 1.0,
        "learner_compute_time": 3.0,
        "parameter_compute_time": 1.0,
        "invocation_overhead": 0.5,
        "cache_time": 0.5,
    }
    return row


def _write_run(root: Path, plan: RunPlan, rewards: list[float], cost: float) -> None:
    path = root / "runs" / plan.run_id
    path.mkdir(parents=True)
    with (path / "info.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=INFO_COLUMNS)
        w.writeheader()
        for i, r in enumerate(rewards, 1):
            w.writerow(_row(i, r, 0 if math.isnan(r) else 2, cost * i / len(rewards)))
    (path / "state.json").write_text(json.dumps({"round": len(rewards), "elapsed_s": 30.0}))


def _plan(variant: str, seed: int) -> RunPlan:
    mode = "sync" if variant == "vanilla" else "stellaris"
    return RunPlan(
        "ppo/Hopper", variant, seed, {"env": "Hopper-v5", "algo": "ppo", "mode": mode, "seed": seed, "rounds": 10}
    )


def test_final_reward_is_the_episode_weighted_tail() -> None:
    rows = [_row(i, float(i), 2, 0.0) for i in range(1, 11)]
    assert final_reward(rows) == pytest.approx((9 + 10) / 2)  # last 20% of 10 rounds
    rows[-1]["episodes"], rows[-2]["episodes"] = 0, 3
    assert final_reward(rows) == pytest.approx(9.0)
    for r in rows:
        r["episodes"] = 0
    rows[3]["episodes"] = 1
    assert final_reward(rows) == pytest.approx(4.0)  # no episodes in the tail: the last round that had some
    rows[3]["episodes"] = 0
    assert math.isnan(final_reward(rows))


def test_window_reward_and_time_to_reward() -> None:
    rows = [_row(i, 10.0 * i, 1 + i % 2, 0.0) for i in range(1, 11)]  # 100 env steps per round, 2 s each
    # (500, 700]: rounds 6 and 7, rewards 60 (2 episodes) and 70 (1 episode)
    assert window_reward(rows, 700, width=200) == pytest.approx((60 * 1 + 70 * 2) / 3)
    assert math.isnan(window_reward(rows, 1100, width=200))  # the run did not get there
    rows[5]["episodes"] = rows[6]["episodes"] = 0
    assert math.isnan(window_reward(rows, 700, width=200))  # no episode ended in the window
    rows = [_row(i, 10.0 * i, 1, 0.0) for i in range(1, 11)]
    # 3-round means: 20 after round 3, 30 after round 4, ...: 50 is first reached after round 6, at 12 s
    assert time_to_reward(rows, 50.0, window=3) == pytest.approx(12.0)
    assert math.isnan(time_to_reward(rows, 100.0, window=3))


def test_summary_means_stds_and_ratios(tmp_path: Path) -> None:
    rewards = {("vanilla", 0): 100.0, ("vanilla", 1): 200.0, ("stellaris", 0): 300.0, ("stellaris", 1): 500.0}
    costs = {("vanilla", 0): 2.0, ("vanilla", 1): 4.0, ("stellaris", 0): 1.0, ("stellaris", 1): 2.0}
    results = []
    for (variant, seed), final in rewards.items():
        plan = _plan(variant, seed)
        _write_run(tmp_path, plan, [1.0] * 8 + [final, final], costs[variant, seed])
        result = run_result(plan, tmp_path / "runs" / plan.run_id)
        assert result is not None
        results.append(result)
    r0 = results[0]
    assert r0.final_reward == 100.0 and r0.cost_usd == 2.0 and r0.wall_clock_s == 30.0 and r0.rounds == 10
    assert r0.cost_learner_usd == 1.5 and r0.cost_actor_usd == 0.5
    assert r0.overhead_share == pytest.approx(1.0 / 5.0)  # (0.5 + 0.5) / (3 + 1 + 0.5 + 0.5)

    rows = write_outputs(tmp_path / "algorithms", "algorithms", results)
    base, ours = rows
    assert (base["variant"], ours["variant"]) == ("vanilla", "stellaris")
    assert base["final_reward_mean"] == 150.0 and base["final_reward_std"] == pytest.approx(math.sqrt(5000))
    assert ours["final_reward_mean"] == 400.0 and ours["cost_usd_mean"] == 1.5
    assert ours["reward_ratio"] == pytest.approx(400 / 150) and ours["cost_ratio"] == pytest.approx(1.5 / 3.0)
    assert base["reward_ratio"] == 1.0 and ours["baseline"] == "vanilla"
    with (tmp_path / "algorithms" / "summary.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [r["variant"] for r in written] == ["vanilla", "stellaris"]
    assert float(written[1]["cost_ratio"]) == pytest.approx(0.5)
    assert (tmp_path / "algorithms" / "runs.csv").read_text().count("\n") == 5


def test_rows_without_a_baseline_have_no_ratio(tmp_path: Path) -> None:
    plan = _plan("stellaris", 0)
    _write_run(tmp_path, plan, [1.0, 2.0], 1.0)
    result = run_result(plan, tmp_path / "runs" / plan.run_id)
    assert result is not None
    (row,) = summarise("breakdown", [result])
    assert math.isnan(row["reward_ratio"]) and row["baseline"] == ""
    assert row["final_reward_std"] == 0.0  # one seed


def test_a_run_without_rounds_has_no_result(tmp_path: Path) -> None:
    assert run_result(_plan("stellaris", 0), tmp_path / "missing") is None
