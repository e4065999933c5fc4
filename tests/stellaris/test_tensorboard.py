"""A short real run leaves TensorBoard scalars per round, curve.png, and `stellaris plot` overlays runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.stellaris.test_train import ROOT, rows, run_train, train_cmd


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tb")
    out = tmp / "run"
    proc = run_train(train_cmd(tmp, "--rounds", "2", "--out", str(out)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_each_round_is_written_as_tensorboard_scalars(run_dir: Path) -> None:
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    info = rows(run_dir / "info.csv")
    columns = {
        "return/mean": "train_reward_mean",
        "staleness/bound": "staleness_bound",
        "throughput/env_steps": "env_steps",
        "cost/total": "cost",
        "latency/round": "duration",
        "learner/aggregations": "aggregations",
    }
    for tag, column in columns.items():
        written = [r for r in info if r[column] not in ("", "nan")]  # a column with no value that round: no point
        assert written, column
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [int(r["round_id"]) for r in written], tag
        assert [e.value for e in events] == pytest.approx([float(r[column]) for r in written], rel=1e-5), tag
    assert len(acc.Scalars("throughput/env_steps_per_s")) == len(info)


def test_a_run_leaves_curve_png_and_plot_groups_seeds(run_dir: Path, tmp_path: Path) -> None:
    assert (run_dir / "curve.png").read_bytes()[:4] == b"\x89PNG"
    other = tmp_path / "seed2"
    shutil.copytree(run_dir, other)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["config"]["seed"] = int(cfg["config"].get("seed") or 0) + 1
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "both.png"
    plot = [sys.executable, "-m", "stellaris.cli", "plot", str(run_dir), str(other), "--out", str(out)]
    done = subprocess.run(plot, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    missing = tmp_path / "nope"
    bad = subprocess.run([*plot[:4], str(missing)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and str(missing) in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_resumed_board_replaces_the_rounds_after_the_checkpoint(tmp_path: Path) -> None:
    """A dead run wrote rounds 1-3 but checkpointed after round 2; the resumed run writes from round 3 again: each
    round appears once, round 3 with the resumed run's value."""
    from stellaris.rundir.tensorboard import RoundBoard

    path = tmp_path / "tensorboard"
    dead = RoundBoard(path)
    for k in (1, 2, 3):
        dead.write({"round_id": k, "train_reward_mean": 10.0 * k})
    dead.close()
    resumed = RoundBoard(path)
    for k in (3, 4):
        resumed.write({"round_id": k, "train_reward_mean": 100.0 * k})
    resumed.close()
    acc = EventAccumulator(str(path))
    acc.Reload()
    events = acc.Scalars("return/mean")
    assert [(e.step, e.value) for e in events] == [(1, 10.0), (2, 20.0), (3, 300.0), (4, 400.0)]
