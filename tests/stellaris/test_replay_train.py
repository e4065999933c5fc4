"""`stellaris train` runs IMPACT on Hopper-v5 (fast preset) with replay set only by `--set`: the second round
trains on a replayed batch beside its fresh one, within the store's byte bound, and no task is dead-lettered."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two Hopper rounds: over 40 s
@pytest.mark.parametrize("replay", ["uniform", "prioritized"])
def test_a_hopper_round_with_replay_through_stellaris_train(tmp_path: Path, replay: str) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "stellaris.cli", "train", "--env", "Hopper-v5", "--algo", "impact", "--preset", "fast",
        "--rounds", "2", "--set", f"replay={replay}", "--set", "replay_ratio=0.5", "--out", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((out / "replay.csv").open()))
    assert [(r["round"], r["pattern"]) for r in rows] == [("1", replay), ("2", replay)]
    assert rows[0]["replayed_batches"] == "0" and int(rows[1]["replayed_batches"]) >= 1
    assert all(0 < int(r["peak_bytes"]) <= int(r["bytes_max"]) for r in rows)
    info = list(csv.DictReader((out / "info.csv").open()))
    assert len(info) == 2 and all(r["dead_lettered"] == "0" for r in info), info
