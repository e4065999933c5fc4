"""The scale model's validation summary (experiments/plan_validation.py) on comparisons made by hand: each seed's
quantities averaged over the rounds compared, then the IQM over seeds (of 5: the mean of the middle 3)."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from experiments import plan_validation

SIDES = ("real", "model")
QUANTITIES = ("train_reward_mean", "staleness_mean", "duration")


def _comparison(path: Path, seed: int, rounds: int = 12) -> None:
    """Round k of seed s: real return 100 s + k, model 100 s + k + 50; staleness 2 (real) and 2 + s/10 (model);
    duration 1 + s/10 (real) and 1 (model); round 1 is odd (as a cold start is) and must not count where left out."""
    columns = ["round_id", *(f"{side}_{q}" for q in QUANTITIES for side in SIDES)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for k in range(1, rounds + 1):
            odd = 1000.0 if k == 1 else 0.0
            writer.writerow(
                {
                    "round_id": k,
                    "real_train_reward_mean": 100 * seed + k,
                    "model_train_reward_mean": 100 * seed + k + 50,
                    "real_staleness_mean": 2.0 + odd,
                    "model_staleness_mean": 2.0 + seed / 10 + odd,
                    "real_duration": 1.0 + seed / 10 + odd,
                    "model_duration": 1.0 + odd,
                }
            )


def test_the_summary_by_hand(tmp_path: Path) -> None:
    paths = []
    for seed in (1, 2, 3, 4, 5):
        paths.append(tmp_path / f"stellaris-s{seed}.csv")
        _comparison(paths[-1], seed)
    summary = {name: (real, model) for name, real, model in plan_validation.summary(paths)}
    ret_real, ret_model = summary["training return, last 10 rounds"]
    # the last 10 of 12 rounds: k = 3..12, mean 7.5; seeds 2, 3 and 4 are the middle three: 300 + 7.5
    assert ret_real.point == pytest.approx(307.5) and ret_model.point == pytest.approx(357.5)
    stale_real, stale_model = summary["mean staleness, rounds 2 on"]
    assert stale_real.point == pytest.approx(2.0) and stale_model.point == pytest.approx(2.3)
    assert stale_real.low == pytest.approx(2.0) and stale_real.high == pytest.approx(2.0)  # no spread, no width
    secs_real, secs_model = summary["seconds per round, rounds 2 on"]
    assert secs_real.point == pytest.approx(1.3) and secs_model.point == pytest.approx(1.0)
    assert secs_real.low <= 1.3 <= secs_real.high and not secs_real.contains(secs_model.point)


def test_a_real_run_is_kept_and_then_reused(tmp_path: Path) -> None:
    """A real 2-round CartPole run: what the model reads of it lands in the kept directory (which the repository
    commits), and the next call reuses it without running again, even once the run directory is gone."""
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    out = plan_validation.kept_run("CartPole-v1", "stellaris", 7, rounds=2, runs=runs, kept=kept)
    assert out == kept / "stellaris-s7"
    assert sorted(p.name for p in out.iterdir()) == sorted((*plan_validation.KEPT_FILES, plan_validation.MACHINE_FILE))
    with (out / "info.csv").open(newline="") as f:
        assert [r["round_id"] for r in csv.DictReader(f)] == ["1", "2"]
    made = (out / "info.csv").stat().st_mtime_ns
    run_dir = runs / "stellaris-s7"
    assert run_dir.is_dir()
    run_dir.rename(tmp_path / "gone")
    assert plan_validation.kept_run("CartPole-v1", "stellaris", 7, rounds=2, runs=runs, kept=kept) == out
    assert not run_dir.exists() and (out / "info.csv").stat().st_mtime_ns == made


def test_the_kept_runs_are_not_ignored_by_git() -> None:
    """They are committed: a .gitignore pattern that matched them (`runs/` once did) would leave the queue unable to
    add them."""
    root = Path(__file__).resolve().parents[2]
    probe = plan_validation.KEPT / "stellaris-s1" / "info.csv"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=root, check=False)
    assert ignored.returncode == 1, f"{plan_validation.KEPT} is git-ignored"
