"""`stellaris train` runs IMPACT on Hopper-v5 (fast preset) with replay set only by `--set`: the second round
trains on a replayed batch beside its fresh one, within the store's byte bound, and no task is dead-lettered."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two Hopper rounds: over 40 s
@pytest.mark.parametrize("replay", ["uniform", "prioritized"])
def test_a_hopper_round_with_replay_through_stellaris_train(tmp_path: Path, replay: str) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "stellaris.cli",
        "train",
        "--env",
        "Hopper-v5",
        "--algo",
        "impact",
        "--preset",
        "fast",
        "--rounds",
        "2",
        "--set",
        f"replay={replay}",
        "--set",
        "replay_ratio=0.5",
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((out / "replay.csv").open()))
    assert [(r["round"], r["pattern"]) for r in rows] == [("1", replay), ("2", replay)]
    assert rows[0]["replayed_batches"] == "0" and int(rows[1]["replayed_batches"]) >= 1
    assert all(0 < int(r["peak_bytes"]) <= int(r["bytes_max"]) for r in rows)
    info = list(csv.DictReader((out / "info.csv").open()))
    assert len(info) == 2 and all(r["dead_lettered"] == "0" for r in info), info


@pytest.mark.slow  # two CartPole runs: about 30 s
def test_a_resumed_run_replays_the_batches_its_dead_run_stored(tmp_path: Path) -> None:
    """kill -9 of a replaying `stellaris train` once replay.csv has a row of round 4 (usually before that round's
    checkpoint), then --resume: the store comes back from the checkpoint (the first resumed round replays a batch of
    the dead run's), replay.csv has each round once, and the run directory holds exactly the held batches' files."""
    from tests.procs import wait_pid_gone
    from tests.stellaris.test_train import descendants, start_until_round

    out = tmp_path / "run"
    replay = ["--set", "replay=fifo", "--set", "replay_ratio=0.5", "--set", "replay_capacity=3"]
    train = [sys.executable, "-m", "stellaris.cli", "train"]
    cmd = [*train, "--env", "CartPole-v1", "--algo", "impact", "--rounds", "1000", *replay, "--out", str(out)]
    proc = start_until_round(cmd, 3)
    kids = descendants(proc.pid)
    deadline = time.monotonic() + 60
    while len(list(csv.DictReader((out / "replay.csv").open()))) < 4:  # round 4 has stored and drawn its batches
        assert time.monotonic() < deadline and proc.poll() is None, "round 4 drew no replay batches"
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=30)
    for pid in kids:
        assert wait_pid_gone(pid, 30), f"process {pid} outlived the killed run"
    done = int(json.loads((out / "state.json").read_text())["round"])
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    resumed = subprocess.run(
        [*train, "--resume", str(out), "--rounds", str(done + 2)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = list(csv.DictReader((out / "replay.csv").open()))
    assert [int(r["round"]) for r in rows] == list(range(1, done + 3))
    first = rows[done]  # the resumed run's first round: its store held the dead run's three batches
    assert (first["fresh_batches"], first["replayed_batches"], first["entries"]) == ("1", "1", "3"), first
    state = json.loads((out / "state.json").read_text())
    held = {f"{rid}.safetensors" for rid, *_ in state["replay"]["entries"]}
    assert len(held) == 3 and {p.name for p in (out / "replay").iterdir()} == held
