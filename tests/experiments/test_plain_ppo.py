"""The plain single-file PPO's reward output: rows the suites' reward measures read, from a real (short) run."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

from experiments.plain_ppo import RoundResult, info_rows
from experiments.summary import window_reward


def test_info_rows_count_steps_and_weigh_episodes_as_runs_do() -> None:
    rounds = [RoundResult(2.0, 2048, [10.0, 20.0]), RoundResult(4.0, 2048, []), RoundResult(1.0, 2048, [40.0])]
    rows = info_rows(rounds)
    assert [r["env_steps"] for r in rows] == [2048, 4096, 6144]
    assert [r["episodes"] for r in rows] == [2, 0, 1]
    assert rows[0]["train_reward_mean"] == 15.0 and math.isnan(rows[1]["train_reward_mean"])
    # Rounds ending in (6144 - 3000, 6144]: rounds 2 (no episode) and 3; in (6144 - 5000, 6144]: rounds 1-3.
    assert window_reward(rows, 6144, width=3000) == 40.0
    assert window_reward(rows, 6144, width=5000) == (2 * 15.0 + 40.0) / 3


def test_cli_writes_a_row_per_round_and_the_reward_windows(tmp_path: Path) -> None:
    out = tmp_path / "plain.csv"
    cmd = [sys.executable, "-m", "experiments.plain_ppo", "--total-steps", "3000", "--seed", "1", "--csv", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["env_steps"]) for r in rows] == [2048, 4096]  # enough rounds of 2048 for 3000 steps
    assert all(float(r["duration"]) > 0 and int(r["episodes"]) > 0 for r in rows)
    assert "round 2/2" in done.stdout and "before 3,000:" in done.stdout
