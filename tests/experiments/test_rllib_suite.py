"""The `rllib` suite without RLlib: equal budgets, the serverful cost of an RLlib run, its run directory as the
summary reads it, summary rows and the figure, and the runner script's spec checks (RLlib itself runs in its own venv,
checked by running `python -m experiments.run rllib --preset quick`)."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import rllib_ppo, rllib_suite
from experiments.run import run_suite
from experiments.runner import Outcome, run_dir
from experiments.suites import ALL_SUITES, RunPlan, plan
from experiments.summary import read_info, run_result, summarise

# docs/experiments.md by hand: a p3.2xlarge ($3.06/h) holds 4 learners, a c6a.32xlarge ($4.896/h) 128 actor cores.
LEARNER_USD_PER_S = 3.06 / 3600 / 4  # 0.0002125
ACTOR_CORE_USD_PER_S = 4.896 / 3600 / 128  # 0.000010625


def test_serverful_cost_of_an_rllib_run_from_wall_time_and_cores() -> None:
    learner, actor = rllib_suite.serverful_cost_usd(100.0, cores=2)
    assert learner == pytest.approx(0.02125) and actor == pytest.approx(0.002125)
    learner, actor = rllib_suite.serverful_cost_usd(3600.0, cores=128, learners=4)
    assert learner == pytest.approx(3.06) and actor == pytest.approx(4.896)  # one whole instance of each, an hour
    assert rllib_suite.serverful_cost_usd(0.0, cores=2) == (0.0, 0.0)
    with pytest.raises(ValueError, match=re.escape("wall_clock_s, cores and learners must be >= 0, got -1.0, 2, 1")):
        rllib_suite.serverful_cost_usd(-1.0, cores=2)


@pytest.mark.parametrize(
    ("preset", "steps", "batch", "minibatch", "epochs", "hidden"),
    [("quick", 12 * 2048, 2048, 512, 4, [64, 64]), ("paper", 50 * 4096, 4096, 1024, 10, [256, 256])],
)
def test_rllib_gets_the_stellaris_runs_budget_seed_and_hyperparameters(
    preset: str, steps: int, batch: int, minibatch: int, epochs: int, hidden: list[int]
) -> None:
    plans = rllib_suite.plans(preset, 2, cores=2)
    assert [(p.variant, p.seed) for p in plans] == [("stellaris", 0), ("rllib", 0), ("stellaris", 1), ("rllib", 1)]
    for ours, theirs in zip(plans[::2], plans[1::2], strict=True):
        spec = theirs.config["rllib"]
        assert ours.group == theirs.group == "ppo/Hopper" and ours.config["env"] == spec["env"] == "Hopper-v5"
        assert spec["seed"] == ours.seed == theirs.seed and theirs.rounds == ours.rounds
        assert spec["env_steps"] == ours.rounds * batch == steps
        assert (spec["cores"], spec["env_runners"], spec["envs_per_env_runner"]) == (2, ours.config["actors"], 2)
        ppo = spec["ppo"]
        sizes = (ppo["train_batch_size_per_learner"], ppo["minibatch_size"], ppo["num_epochs"])
        assert sizes == (batch, minibatch, epochs)
        assert ppo["fcnet_hiddens"] == hidden and ppo["fcnet_activation"] == "tanh"
        assert theirs.run_id.startswith(f"hopper-ppo-rllib-s{theirs.seed}-") and theirs.run_id != ours.run_id
    fast, paper = plans[1].config["rllib"]["ppo"], rllib_suite.plans("paper", 1, cores=2)[1].config["rllib"]["ppo"]
    if preset == "quick":  # CleanRL's settings, as Stellaris's fast preset
        assert (fast["lr"], fast["clip_param"], fast["grad_clip"], fast["use_kl_loss"]) == (3e-4, 0.2, 0.5, False)
        assert fast["normalize_obs"] and fast["vf_loss_coeff"] == 0.5
    else:  # Table III: RLlib's defaults with the paper's lr, clip and KL
        assert (paper["lr"], paper["clip_param"], paper["kl_coeff"], paper["use_kl_loss"]) == (5e-5, 0.3, 0.2, True)
        assert paper["grad_clip"] is None and not paper["normalize_obs"]


def test_the_stellaris_side_is_planned_with_the_suites_and_env_runners_fit_the_cores() -> None:
    assert "rllib" in ALL_SUITES
    ours = plan("rllib", "quick", 1)
    assert [(p.variant, p.rounds, p.config["mode"]) for p in ours] == [("stellaris", 12, "stellaris")]
    one_core = rllib_suite.plans("quick", 1, ["rllib"], cores=1)
    assert [p.variant for p in one_core] == ["rllib"] and one_core[0].config["rllib"]["env_runners"] == 1
    with pytest.raises(ValueError, match=r"unknown variant\(s\) vanilla of rllib; choose from stellaris, rllib"):
        rllib_suite.plans("quick", 1, ["vanilla"], cores=2)
    with pytest.raises(ValueError, match="cores must be at least 1, got 0"):
        rllib_suite.plans("quick", 1, cores=0)


def test_the_spec_the_suite_writes_is_the_spec_the_runner_script_reads() -> None:
    for preset in ("quick", "paper", "long"):
        spec = rllib_suite.plans(preset, 1, ["rllib"], cores=2)[0].config["rllib"]
        assert rllib_ppo.RunSpec.from_dict(json.loads(json.dumps(spec))).to_dict() == {
            **spec,
            "ppo": {**spec["ppo"], "fcnet_hiddens": tuple(spec["ppo"]["fcnet_hiddens"])},
            "object_store_bytes": 200_000_000,
            "max_iterations": 100_000,
            "env_kwargs": {},
        }


def _spec() -> dict:
    return rllib_suite.plans("quick", 1, ["rllib"], cores=2)[0].config["rllib"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"speed": 1}, "unknown field(s) in the run spec: speed"),
        ({"ppo": {**_spec()["ppo"], "momentum": 0.9}}, "unknown field(s) in the run spec: ppo.momentum"),
        ({"env_steps": 0}, "env_steps must be at least 1, got 0"),
        ({"env_runners": 3}, "env_runners (3) needs one core each, but cores is 2"),
        ({"ppo": {**_spec()["ppo"], "minibatch_size": 300}}, "not a multiple of ppo.minibatch_size 300"),
    ],
)
def test_a_bad_run_spec_is_named(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rllib_ppo.RunSpec.from_dict({**_spec(), **change})


def test_a_run_spec_missing_fields_names_them() -> None:
    spec = {k: v for k, v in _spec().items() if k != "seed"}
    spec["ppo"] = {k: v for k, v in spec["ppo"].items() if k != "lr"}
    with pytest.raises(ValueError, match=re.escape("missing field(s) in the run spec: seed, ppo.lr")):
        rllib_ppo.RunSpec.from_dict(spec)


def test_a_progress_row_is_the_mean_return_of_the_episodes_that_ended_in_the_iteration() -> None:
    result = {
        "env_runners": {
            rllib_ppo.RETURN_SUM_KEY: 100.0,
            rllib_ppo.EPISODES_KEY: 4,
            "episode_return_mean": 21.5,
            "num_env_steps_sampled_lifetime": 4100,
        }
    }
    row = rllib_ppo.progress_row(2, result, iteration_s=1.5, train_s=3.0, wall_s=40.0)
    assert row == {
        "iteration": 2,
        "env_steps": 4100,
        "episodes": 4,
        "return_mean": 25.0,
        "return_mean_rllib": 21.5,
        "iteration_s": 1.5,
        "train_s": 3.0,
        "wall_clock_s": 40.0,
    }
    no_episodes = {"env_runners": {"num_env_steps_sampled_lifetime": 2050}}
    empty = rllib_ppo.progress_row(1, no_episodes, iteration_s=1, train_s=1, wall_s=1)
    assert empty["episodes"] == 0 and math.isnan(empty["return_mean"]) and empty["env_steps"] == 2050


# Ten iterations of 2050 env steps, 10 s of setup then 2 s each; the last two end 4 and 1 episodes.
PROGRESS = [
    {
        "iteration": i,
        "env_steps": 2050 * i,
        "episodes": 4 if i == 9 else (1 if i == 10 else 3),
        "return_mean": 10.0 * i,
        "return_mean_rllib": 9.0 * i,
        "iteration_s": 2.0,
        "train_s": 2.0 * i,
        "wall_clock_s": 10.0 + 2.0 * i,
    }
    for i in range(1, 11)
]
RESULT = {
    "status": "done",
    "iterations": 10,
    "env_steps": 20500,
    "setup_s": 10.0,
    "train_s": 20.0,
    "wall_clock_s": 30.0,
    "cores": 2,
    "env_runners": 2,
    "learners": 1,
    "ray_version": "2.60.0",
}


STELLARIS_INFO_COLUMNS = (
    "round_id",
    "duration",
    "episodes",
    "train_reward_mean",
    "env_steps",
    "cost",
    "cost_learner",
    "cost_actor",
)


def _write_rllib_run(root: Path, p: RunPlan) -> Path:
    """What rllib_ppo.py leaves in a run directory, by hand, then the suite's conversion of it."""
    path = run_dir(root, p)
    path.mkdir(parents=True)
    with (path / "progress.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=rllib_ppo.PROGRESS_COLUMNS)
        writer.writeheader()
        writer.writerows(PROGRESS)
    (path / "result.json").write_text(json.dumps(RESULT))
    rllib_suite.finish(path, p)
    return path


def _write_stellaris_run(root: Path, p: RunPlan) -> None:
    """A finished Stellaris run's info.csv and state.json, by hand: ten rounds of 2048 env steps, return 30 + 5k."""
    path = run_dir(root, p)
    path.mkdir(parents=True)
    with (path / "info.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(STELLARIS_INFO_COLUMNS)
        for k in range(1, 11):
            writer.writerow([k, 3.0, 2, 30.0 + 5 * k, 2048 * k, 0.001 * k, 0.0008 * k, 0.0002 * k])
    (path / "state.json").write_text(json.dumps({"round": 10, "elapsed_s": 35.0, "env_steps": 20480}))


def test_an_rllib_run_reads_as_a_run_directory_priced_serverful(tmp_path: Path) -> None:
    p = rllib_suite.plans("quick", 1, ["rllib"], cores=2)[0]
    path = _write_rllib_run(tmp_path, p)
    assert rllib_suite.is_finished(tmp_path, p)
    rows = read_info(path)
    assert [r["env_steps"] for r in rows] == [2050.0 * i for i in range(1, 11)]
    # Iteration 3 ends 16 s after ray.init: 16 s of a learner slot and of 2 actor cores.
    assert rows[2]["cost_learner"] == pytest.approx(16 * LEARNER_USD_PER_S)
    assert rows[2]["cost_actor"] == pytest.approx(16 * 2 * ACTOR_CORE_USD_PER_S)
    r = run_result(p, path)
    assert r is not None and (r.variant, r.rounds, r.env_steps, r.wall_clock_s) == ("rllib", 10, 20500, 30.0)
    # The last 20% of 10 iterations: 90 over 4 episodes and 100 over 1, episode-weighted.
    assert r.final_reward == pytest.approx((4 * 90 + 100) / 5)
    assert r.cost_usd == pytest.approx(30 * (LEARNER_USD_PER_S + 2 * ACTOR_CORE_USD_PER_S))  # 0.006375 + 0.0006375
    assert r.cost_learner_usd == pytest.approx(0.006375) and r.cost_actor_usd == pytest.approx(0.0006375)
    assert math.isnan(r.staleness_mean)
    seen: list[Outcome] = []  # finished: never run again (no interpreter is needed to skip it)
    rllib_suite.execute(tmp_path, [p], tmp_path / "no-python", on_outcome=seen.append)
    assert [o.status for o in seen] == ["skipped"]


def test_summary_has_a_row_per_system_with_stellaris_compared_to_rllib(tmp_path: Path) -> None:
    plans = rllib_suite.plans("quick", 1, cores=2)
    _write_stellaris_run(tmp_path, plans[0])
    _write_rllib_run(tmp_path, plans[1])
    results = [r for p in plans if (r := run_result(p, run_dir(tmp_path, p))) is not None]
    rows = {row["variant"]: row for row in summarise("rllib", results)}
    assert list(rows) == ["stellaris", "rllib"]
    ours, theirs = rows["stellaris"], rows["rllib"]
    assert (ours["env_steps"], theirs["env_steps"]) == (20480, 20500)
    assert ours["final_reward_mean"] == pytest.approx(77.5)  # rounds 9 and 10: (75 + 80) / 2
    assert theirs["final_reward_mean"] == pytest.approx(92.0)
    assert (ours["cost_usd_mean"], ours["wall_clock_s_mean"]) == (pytest.approx(0.01), 35.0)
    assert theirs["cost_usd_mean"] == pytest.approx(0.0070125) and theirs["baseline"] == "rllib"
    assert ours["baseline"] == "rllib" and ours["reward_ratio"] == pytest.approx(77.5 / 92.0)
    assert ours["cost_ratio"] == pytest.approx(0.01 / 0.0070125) and ours["time_ratio"] == pytest.approx(35 / 30)


def test_the_suite_writes_summary_and_figure_from_finished_runs(tmp_path: Path) -> None:
    plans = rllib_suite.plans("quick", 1, cores=2)
    _write_stellaris_run(tmp_path, plans[0])
    _write_rllib_run(tmp_path, plans[1])
    code = run_suite("rllib", preset="quick", seeds=1, out=tmp_path, report_only=True, rllib_cores=2)
    assert code == 0
    with (tmp_path / "rllib" / "summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert [(r["variant"], r["env_steps"]) for r in summary] == [("stellaris", "20480"), ("rllib", "20500")]
    assert float(summary[1]["cost_usd_mean"]) == pytest.approx(0.0070125)
    assert (tmp_path / "rllib" / "rllib.png").stat().st_size > 10_000


def test_a_failing_rllib_run_is_reported_with_the_scripts_error(tmp_path: Path) -> None:
    """The real script with this interpreter: it rejects a spec before importing Ray, and the suite says why."""
    p = rllib_suite.plans("quick", 1, ["rllib"], cores=2)[0]
    bad = RunPlan(p.group, p.variant, p.seed, {**p.config, "rllib": {**p.config["rllib"], "env_runners": 3}})
    seen: list[Outcome] = []
    lines: list[str] = []
    outcomes = rllib_suite.execute(tmp_path, [bad], Path(sys.executable), on_outcome=seen.append, echo=lines.append)
    assert outcomes == seen and [o.status for o in seen] == ["failed"]
    assert "exit code 2" in seen[0].detail and "env_runners (3) needs one core each, but cores is 2" in seen[0].detail
    assert not rllib_suite.is_finished(tmp_path, bad)


def test_the_runner_script_refuses_a_bad_spec_file(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({**_spec(), "cores": 0}))
    done = subprocess.run(
        [sys.executable, str(rllib_suite.SCRIPT), "--config", str(tmp_path / "run.json"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cores must be at least 1, got 0" in done.stderr
