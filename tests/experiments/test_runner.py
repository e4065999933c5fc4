"""The suite runner end to end on a tiny budget: real `stellaris train` subprocesses against one embedded Redis and
one local gateway, then summary.csv and figures; finished runs are skipped and interrupted ones resumed."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.run import make_figures
from experiments.runner import Deployment, Outcome, execute, run_dir
from experiments.suites import RunPlan
from experiments.summary import run_result, write_outputs
from gateway.models import LEARNER_PRICING
from stellaris.platform.local import Platform

TINY = {
    "env": "CartPole-v1",
    "algo": "ppo",
    "preset": "fast",
    "rounds": 2,
    "learners": 2,
    "actors": 1,
    "overrides": {"train_batch_size": 256, "num_minibatches": 2, "num_epochs": 1},
}
PLANS = [
    RunPlan("ppo/CartPole", "vanilla", 0, {**TINY, "seed": 0, "mode": "sync", "billing": "serverful"}),
    RunPlan("ppo/CartPole", "stellaris", 0, {**TINY, "seed": 0, "mode": "stellaris", "billing": "serverless"}),
]


def _run(root: Path, deployment: Deployment) -> dict[str, Outcome]:
    outcomes: list[Outcome] = []
    execute(root, PLANS, deployment, parallel=2, on_outcome=outcomes.append)
    return {o.plan.variant: o for o in outcomes}


@pytest.fixture(scope="module")
def deployment():
    with Platform(redis_url=None, gateway_url=None, gateway_token=None) as platform:
        assert platform.cache is not None and platform.gateway_url is not None
        yield Deployment(platform.cache.url, platform.gateway_url, platform.gateway_token)


@pytest.mark.slow  # over 40 s: CI's long stage (make test-long)
def test_runner_summary_figures_skip_and_resume(tmp_path: Path, deployment: Deployment) -> None:
    first = _run(tmp_path, deployment)
    assert {v: o.status for v, o in first.items()} == {"vanilla": "done", "stellaris": "done"}, first

    results = [run_result(p, run_dir(tmp_path, p)) for p in PLANS]
    assert all(r is not None and r.rounds == 2 and r.env_steps == 512 for r in results)
    rows = write_outputs(tmp_path / "algorithms", "algorithms", [r for r in results if r is not None])
    base, ours = rows
    assert base["variant"] == "vanilla" and ours["baseline"] == "vanilla"
    assert ours["cost_usd_mean"] > 0 and base["cost_usd_mean"] > 0
    assert ours["cost_ratio"] == pytest.approx(ours["cost_usd_mean"] / base["cost_usd_mean"])
    assert not math.isnan(ours["reward_ratio"])
    with (tmp_path / "algorithms" / "summary.csv").open() as f:
        assert [r["variant"] for r in csv.DictReader(f)] == ["vanilla", "stellaris"]
    # One cost model, two billings (docs/experiments.md): serverful holds 2 learner slots + the parameter server for
    # the whole
    # wall clock; serverless pays each invocation's metered cost.
    vanilla = json.loads((run_dir(tmp_path, PLANS[0]) / "state.json").read_text())
    slot_per_s = LEARNER_PRICING.usd_per_second
    assert vanilla["cost_learner"] == pytest.approx(vanilla["elapsed_s"] * 3 * slot_per_s, rel=0.02)
    ours_dir = run_dir(tmp_path, PLANS[1])
    with (ours_dir / "invocations.csv").open() as f:
        metered = sum(float(r["cost"]) for r in csv.DictReader(f))
    assert json.loads((ours_dir / "state.json").read_text())["cost_learner"] == pytest.approx(metered)
    with (ours_dir / "info.csv").open() as f:
        info = list(csv.DictReader(f))
    for row in info:  # the latency breakdown is recorded every round
        assert float(row["learner_compute_time"]) > 0 and float(row["cache_time"]) > 0
        assert float(row["invocation_overhead"]) > 0 and float(row["parameter_compute_time"]) > 0
        assert float(row["cost"]) == pytest.approx(float(row["cost_learner"]) + float(row["cost_actor"]))
    for suite in ("algorithms", "cost", "breakdown"):
        made = make_figures(suite, tmp_path / "algorithms", tmp_path, PLANS, [r for r in results if r], "tiny")
        assert made and all(p.stat().st_size > 10_000 for p in made), made
    log = (run_dir(tmp_path, PLANS[0]) / "log.txt").read_text()
    assert deployment.gateway_token and deployment.gateway_token not in log  # secrets stay out of logs
    redis_password = deployment.redis_url.split("@")[0].rsplit(":", 1)[-1]
    assert redis_password and redis_password not in log and "--redis-url redis://:***@" in log

    again = _run(tmp_path, deployment)
    assert {o.status for o in again.values()} == {"skipped"}

    # A run stopped after its first round: the next suite invocation resumes it from its checkpoint.
    path = run_dir(tmp_path, PLANS[1])
    state = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps({**state, "round": 1}))
    resumed = _run(tmp_path, deployment)
    assert resumed["stellaris"].status == "done" and resumed["vanilla"].status == "skipped"
    assert "--resume" in (path / "log.txt").read_text()
    with (path / "info.csv").open() as f:
        # The row the run wrote after its checkpoint (round 2) is dropped on resume, and round 2 is written again.
        assert [r["round_id"] for r in csv.DictReader(f)] == ["1", "2"]


def test_cli_names_a_bad_suite() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.run", "nope"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "unknown suite 'nope'" in proc.stderr


def test_cli_names_a_negative_first_seed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.run", "ablation", "--first-seed", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "first_seed must be at least 0" in proc.stderr
