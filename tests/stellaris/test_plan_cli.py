"""`stellaris plan` (docs/scale-model.md#running-stellaris-plan): a bad input is one line naming what was wrong, exit
2, before anything is computed; a plan prints its table and writes a CSV per N and the summary; `--compare` models a
real run's job and writes the round-by-round comparison."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from stellaris.cli import app
from stellaris.config import ConfigError
from stellaris.plan.command import learner_counts
from stellaris.plan.report import COLUMNS, COMPARE_COLUMNS, SUMMARY_COLUMNS

SMALL = ["--set", "train_batch_size=256", "--set", "num_minibatches=4", "--set", "num_epochs=2"]


def _plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--rounds", "1", "--learners", "0"], "--learners: '0' is not a whole number of learners"),
        (["--rounds", "1", "--learners", "2,x"], "--learners: 'x'"),
        (["--rounds", "1", "--straggler-p", "1.5"], "--straggler-p: Input should be less than or equal to 1, got 1.5"),
        (["--rounds", "1", "--cold-start-s", "-1"], "--cold-start-s: Input should be greater than or equal to 0"),
        (["--rounds", "1", "--d", "1.5"], "d: Input should be less than or equal to 1"),
        (["--rounds", "1", "--learners", "300"], "learners: Input should be less than or equal to 256"),
        (["--rounds", "1", "--mode", "bogus"], "mode: Input should be"),
        (["--rounds", "1", "--env", "NoSuchEnv-v0"], "unknown Gymnasium env id 'NoSuchEnv-v0'"),
        (["--rounds", "1", "--set", "lr=-1"], "overrides.lr: Input should be greater than 0"),
        (["--rounds", "1", "--task-s", "0"], "--task-s: give a positive number of seconds"),
        (["--rounds", "1", "--apply-s", "-1"], "--apply-s: give a positive number of seconds"),
        (["--rounds", "1", "--eval-episodes", "-1"], "--eval-episodes: give 0 or more"),
        ([], "give --rounds or --total-steps"),
        (["--compare", "no/such/run"], "--compare: no/such/run is not a directory"),
        (["--rounds", "1", "--calibrate", "no/such/run"], "--calibrate: no/such/run is not a directory"),
    ],
)
def test_a_bad_input_is_one_line_naming_it(args: list[str], named: str, tmp_path: Path) -> None:
    code, output = _plan(*args, "--out", str(tmp_path / "out"))
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], output
    assert not (tmp_path / "out").exists()  # nothing ran


def test_learner_counts_take_lists_and_repeats() -> None:
    assert learner_counts(["1,2,4", "8", "2"]) == [1, 2, 4, 8]
    assert learner_counts([" 16 , 1 "]) == [16, 1]
    with pytest.raises(ConfigError, match="at least one"):
        learner_counts([","])


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_plan_prints_its_table_and_writes_a_csv_per_n(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    code, output = _plan(
        "--env",
        "CartPole-v1",
        "--learners",
        "1",
        "--learners",
        "3",
        "--rounds",
        "2",
        "--mode",
        "async",
        "--straggler-p",
        "0.2",
        "--speed-spread",
        "1",
        "--eval-episodes",
        "1",
        *SMALL,
        "--out",
        str(out),
    )
    assert code == 0, output
    assert "CartPole-v1 ppo async" in output and "staleness" in output
    assert sorted(p.name for p in out.iterdir()) == ["learners-1.csv", "learners-3.csv", "summary.csv"]
    for n in (1, 3):
        rows = _csv(out / f"learners-{n}.csv")
        assert list(rows[0]) == COLUMNS and [r["round_id"] for r in rows] == ["1", "2"]
        assert {r["learners"] for r in rows} == {str(n)} and {r["gradients_applied"] for r in rows} == {"8"}
        assert rows[-1]["eval_episodes"] == "1"
    summary = _csv(out / "summary.csv")
    assert list(summary[0]) == SUMMARY_COLUMNS and [s["learners"] for s in summary] == ["1", "3"]
    assert float(summary[1]["staleness_mean"]) > 0


def test_compare_models_a_real_runs_job_and_writes_the_comparison(tmp_path: Path) -> None:
    """A run directory as `stellaris train` leaves it (config.yaml's `config` section, info.csv): the model takes
    its env, rule, N and overrides, models as many rounds as info.csv has, and pairs them."""
    run = tmp_path / "run"
    run.mkdir()
    config = {
        "env": "CartPole-v1",
        "mode": "sync",
        "learners": 1,
        "seed": 2,
        "total_steps": 100_000,
        "overrides": {"train_batch_size": 256, "num_minibatches": 4, "num_epochs": 2},
    }
    (run / "config.yaml").write_text(yaml.safe_dump({"config": config, "job_spec": {}}))
    columns = [
        "round_id",
        "duration",
        "train_reward_mean",
        "staleness_mean",
        "gradients_applied",
        "aggregations",
        "cost",
    ]
    with (run / "info.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([[1, 3.5, 20.0, 0.0, 8, 8, 0.001], [2, 1.5, 25.0, 0.0, 8, 8, 0.002]])
    out = tmp_path / "plan"
    code, output = _plan("--compare", str(run), "--eval-episodes", "0", "--out", str(out))
    assert code == 0, output
    assert "real run / model" in output
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv", "learners-1.csv", "summary.csv"]
    compared = _csv(out / "compare.csv")
    assert list(compared[0]) == COMPARE_COLUMNS and [r["round_id"] for r in compared] == ["1", "2"]
    assert [r["real_train_reward_mean"] for r in compared] == ["20.0", "25.0"]
    assert {r["model_staleness_mean"] for r in compared} == {"0.0"} and {
        r["model_gradients_applied"] for r in compared
    } == {"8.0"}
    rows = _csv(out / "learners-1.csv")
    assert [r["round_id"] for r in rows] == ["1", "2"]  # the run's two rounds, not its planned 100,000 steps


def test_compare_needs_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"config": {"env": "CartPole-v1"}}))
    code, output = _plan("--compare", str(tmp_path), "--out", str(tmp_path / "out"))
    assert code == 2 and "info.csv" in output, output


def _calibration_run(run: Path, env: str = "CartPole-v1", mode: str = "stellaris") -> Path:
    """A one-learner run directory whose two rounds after round 1 measured 1 and 3 ms of overhead a task, 2 and 4 ms
    an apply in all, 61.5 and 59.5 ms of compute a task and 0.5 s of collection; in each, its gradients arrived 61
    and 64 ms apart (a cadence of 62.5 ms: the same overheads as its learning phases give); its rounds' starts, by
    its invocations, were 227.5 and 217.5 ms (the phase, 0.5 s, less the first task, 62.5 ms, less the 210 and 220
    ms from the first arrival to the parameter function's end; the actor's invocation does not count)."""
    run.mkdir()
    small = {"train_batch_size": 256, "num_minibatches": 4, "num_epochs": 2}  # SMALL's
    config = {"env": env, "mode": mode, "learners": 1, "rounds": 3, "overrides": small}
    (run / "config.yaml").write_text(yaml.safe_dump({"config": config}))
    columns = ["round_id", "learners", "duration", "actor_time", "learner_compute_time", "gradients_applied"]
    columns += ["learner_time", "learner_wait_time", "cache_time", "parameter_compute_time", "aggregations"]
    with (run / "info.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(
            [
                [1, 1, 5.0, 1.0, 0.1, 8, 3.0, 0.0, 1.0, 0.1, 8],
                # (1 - 0.5 - 0.492) / 8 = 1 ms; the learner busy 0.008 of 0.024: the parameter's 0.016 / 8 = 2 ms
                [2, 1, 1.0, 0.5, 0.492, 8, 0.5, 0.0, 0.024, 0.0, 8],
                # (1 - 0.5 - 0.476) / 8 = 3 ms; the learner busy 0.024 of 0.056: 0.032 / 8 = 4 ms
                [3, 1, 1.0, 0.5, 0.476, 8, 0.5, 0.0, 0.056, 0.0, 8],
            ]
        )
    stamps = [(1, 90), (2, 100), (2, 161), (2, 225), (3, 300), (3, 361), (3, 425)]
    with (run / "gradients.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gradient_id", "task_id", "round", "base_version", "applied_version"])
        writer.writerows([f"{ms}-0", f"{ms}-1", k, 0, 1] for k, ms in stamps)
    spans = [("learner", 0.05, 0.30), ("parameter", 0.06, 0.31), ("learner", 0.29, 0.50), ("parameter", 0.295, 0.52)]
    with (run / "invocations.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["function", "start", "end"])
        writer.writerows([[f"j1-{name}", start, end] for name, start, end in [*spans, ("actor", 0.0, 0.9)]])
    return run


def test_calibrate_takes_a_real_runs_timings_and_flags_win(tmp_path: Path) -> None:
    """The medians: 2 ms of overhead, 3 ms an apply, 60.5 ms of compute, 0.5 s of collection; within each round the
    gaps 61 and 64 ms spread 4.5 ms² about their mean, 13/3 ms² beyond their rounding: σ = √ln(1 + (13/3) / 60.5²)
    = 0.03440. Each modelled round takes one calibration round's timings; a flag given takes their place."""
    run = _calibration_run(tmp_path / "run")
    out = tmp_path / "plan"
    args = ["--env", "CartPole-v1", "--rounds", "2", "--learners", "1", *SMALL, "--eval-episodes", "0"]
    code, output = _plan(*args, "--calibrate", str(run), "--out", str(out))
    assert code == 0, output
    said = " ".join(output.split())  # as one line, whatever the terminal's width
    assert (
        "calibrated over 2 rounds (medians): a task's compute 60.500 ms and overhead 2.000 ms, an apply 3.000 ms in "
        "all, a batch's collection 0.500 s, a round's start 222.500 ms, the tasks' jitter σ 0.034; each modelled "
        "round takes one of those rounds' timings, σ 0.034" in said
    ), output
    rows = _csv(out / "learners-1.csv")
    assert [float(r["actor_time"]) for r in rows] == pytest.approx([0.5, 0.5])  # calibrated, not this machine's
    given = ["--apply-s", "0.005", "--task-s", "0.01", "--jitter-sigma", "0", "--collect-s", "1"]
    code, output = _plan(*args, "--calibrate", str(run), *given, "--out", str(tmp_path / "given"))
    assert code == 0, output
    said = " ".join(output.split())
    assert "(--task-s 0.01, --collect-s 1.0, --apply-s 0.005 in their place), σ 0.000" in said, output
    assert [float(r["actor_time"]) for r in _csv(tmp_path / "given" / "learners-1.csv")] == [1.0, 1.0]
    # two runs pool their rounds
    code, output = _plan(*args, "--calibrate", str(run), "--calibrate", str(run), "--out", str(tmp_path / "two"))
    assert code == 0 and "calibrated over 4 rounds" in output, output


def test_a_sync_plan_takes_its_jitter_from_a_run_of_another_rule(tmp_path: Path) -> None:
    """A sync learner's arrivals hold its applies and its waits: its own calibration measures no jitter, and
    --jitter-from takes the tasks' σ from a Stellaris run of the same job (0.034, as above); a sync run is refused."""
    sync_run, run = _calibration_run(tmp_path / "sync", mode="sync"), _calibration_run(tmp_path / "run")
    args = ["--env", "CartPole-v1", "--mode", "sync", "--rounds", "1", "--learners", "1", *SMALL]
    args += ["--eval-episodes", "0", "--calibrate", str(sync_run)]
    code, output = _plan(*args, "--out", str(tmp_path / "own"))
    said = " ".join(output.split())
    assert code == 0 and "the tasks' jitter σ not measured;" in said and "timings, σ 0.000" in said, output
    code, output = _plan(*args, "--jitter-from", str(run), "--out", str(tmp_path / "from"))
    said = " ".join(output.split())
    assert code == 0 and "the tasks' jitter σ not measured;" in said and "timings, σ 0.034" in said, output
    code, output = _plan(*args, "--jitter-from", str(sync_run), "--out", str(tmp_path / "no"))
    assert code == 2 and f"--jitter-from: {sync_run} ran mode 'sync'" in " ".join(output.split()), output
    assert not (tmp_path / "no").exists()


def test_calibrate_refuses_a_run_it_cannot_calibrate_from(tmp_path: Path) -> None:
    run = _calibration_run(tmp_path / "run")
    args = ["--env", "CartPole-v1", "--rounds", "1", "--learners", "1", *SMALL, "--eval-episodes", "0"]
    several = tmp_path / "several"
    several.mkdir()
    (several / "config.yaml").write_text((run / "config.yaml").read_text())
    (several / "info.csv").write_text((run / "info.csv").read_text().replace("\n2,1,", "\n2,4,"))
    code, output = _plan(*args, "--calibrate", str(several), "--out", str(tmp_path / "no"))
    assert code == 2 and "--calibrate:" in output and "this one ran 4 learners" in output, output
    other = _calibration_run(tmp_path / "acrobot", env="Acrobot-v1")
    code, output = _plan(*args, "--calibrate", str(run), "--calibrate", str(other), "--out", str(tmp_path / "no"))
    assert code == 2, output
    assert f"--calibrate: {other} ran env 'Acrobot-v1', the plan 'CartPole-v1'" in output, output
    # a sync learner waits for each apply, a Stellaris one does not: one mode's timings do not stand for another's
    code, output = _plan(*args, "--mode", "sync", "--calibrate", str(run), "--out", str(tmp_path / "no"))
    assert code == 2 and f"--calibrate: {run} ran mode 'stellaris', the plan 'sync'" in output, output
    assert not (tmp_path / "no").exists()
