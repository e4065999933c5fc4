"""The evaluation campaign (experiments/campaign.py) and its results page (experiments/report.py): the plan's cells,
one real cell run end to end and skipped the second time, and the page rebuilt from a small fixture of CSVs."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml

from experiments import campaign, machine, report


def test_the_modes_plan_holds_every_cell_once_seed_major() -> None:
    cells = campaign.plan_cells("modes")
    # 5 seeds × (Hopper: 5 modes, Walker2d and HalfCheetah: 3 each)
    assert len(cells) == 5 * (5 + 3 + 3) == len({c.id for c in cells})
    assert [c.seed for c in cells] == sorted(c.seed for c in cells)  # a campaign cut short has every mode's seed 1
    assert {c.mode for c in cells if c.env == "Walker2d-v5"} == {"stellaris", "sync", "async"}
    assert cells[0].command(Path("o"))[3:] == [
        "train",
        "--env",
        "Hopper-v5",
        "--algo",
        "ppo",
        "--preset",
        "fast",
        "--mode",
        "stellaris",
        "--seed",
        "1",
        "--total-steps",
        "500000",
        "--eval-every",
        "41",
        "--eval-episodes",
        "10",
        "--out",
        "o",
    ]


def test_an_unknown_plan_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="unknown plan 'nope'"):
        campaign.plan_cells("nope")


def test_a_real_cell_lands_its_csv_once(tmp_path: Path) -> None:
    """Two rounds of Hopper through `stellaris train`: the cell's CSV and index row land; asked again, the campaign
    skips it."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "experiments.campaign",
        "run",
        "smoke",
        "--seeds",
        "3",
        "--steps",
        "4096",
        "--results",
        str(results),
        "--runs",
        str(runs),
        "--limit",
        "1",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 to run" not in first.stderr and "2 to run" in first.stderr
    with (results / "hopper-v5-ppo-stellaris-s3.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [1, 2] and int(rows[-1]["env_steps"]) >= 4096
    assert float(rows[-1]["wall_s"]) > float(rows[0]["wall_s"]) > 0 and float(rows[-1]["cost"]) > 0
    assert int(rows[-1]["eval_episodes"]) == 10  # the last round is evaluated
    again = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert "1 finished, 1 to run" in again.stderr  # the landed cell is skipped; the other one would run
    assert "would run hopper-v5-ppo-sync-s3" in again.stderr and "would run hopper-v5-ppo-stellaris" not in again.stderr
    with (results / "cells.csv").open(newline="") as f:
        index = list(csv.DictReader(f))
    assert [r["cell"] for r in index] == ["hopper-v5-ppo-stellaris-s3"]
    assert float(index[0]["run_s"]) > 0 and "cores" in index[0]["machine"]


def _fixture(
    results: Path, modes: tuple[tuple[str, float], ...] = (("stellaris", 1.0), ("sync", 2.0)), learners: int = 0
) -> None:
    """Hopper, each mode at its seconds a round (stellaris and sync unless told), 3 seeds each: returns rising
    linearly with steps, evaluations every 41 rounds and at the end; modelled at `learners` when given."""
    rng = np.random.default_rng(0)
    index = []
    for mode, secs_per_round in modes:
        for seed in (1, 2, 3):
            cell = f"hopper-v5-ppo-{mode}{f'-n{learners}' if learners else ''}-s{seed}"
            rows = []
            for k in range(1, 246):
                ret = 3000 * k / 245 + rng.normal(0, 50)
                evaluated = k % 41 == 0 or k == 245
                rows.append(
                    {
                        "round": k,
                        "env_steps": 2048 * k,
                        "wall_s": secs_per_round * k,
                        "train_return": ret,
                        "episodes": 5,
                        "eval_return": ret + 100 if evaluated else "",
                        "eval_episodes": 10 if evaluated else 0,
                        "cost": 0.0001 * k * secs_per_round,
                        "staleness_mean": 0.5,
                        "gradients_applied": 32,
                        "aggregations": 32 // (learners or 1),
                    }
                )
            campaign.write_csv(results / f"{cell}.csv", campaign.CELL_COLUMNS, rows)
            index.append(
                {
                    "cell": cell,
                    "env": "Hopper-v5",
                    "mode": mode,
                    "seed": seed,
                    "steps": 500000,
                    "preset": "fast",
                    "algo": "ppo",
                    "learners": learners or "",
                    "run_s": 245 * secs_per_round + 5,
                    "attempts": 1,
                    "rounds": 245,
                    "commit": "abc1234",
                    "machine": "test machine",
                    "finished": "2026-12-07 06:00",
                }
            )
    campaign.write_csv(results / "cells.csv", campaign.INDEX_COLUMNS, index)


def test_time_to_a_return_by_hand(tmp_path: Path) -> None:
    rows = [
        {"env_steps": 2048.0 * k, "wall_s": 10.0 * k, "train_return": float(r), "episodes": 1.0}
        for k, r in enumerate([100, 200, 300, 400, 500, 600, 700], 1)
    ]
    run = report.Run("c", "Hopper-v5", "sync", 1, 70.0, rows)
    # the mean of the last 5 rounds' returns: round 5 -> 300, round 6 -> 400, round 7 -> 500
    assert report.time_to(run, 400) == 60.0
    assert report.time_to(run, 150) == 20.0  # round 2: the mean of rounds 1-2 is 150
    assert math.isinf(report.time_to(run, 10_000))


def test_the_page_is_rebuilt_from_the_csvs(tmp_path: Path) -> None:
    results, page = tmp_path / "results", tmp_path / "docs" / "evaluation.md"
    page.parent.mkdir()
    _fixture(results)
    report.build(results, page, reps=200)
    text = page.read_text()
    assert "| stellaris | 1, 2, 3 |" in text and "| sync | 1, 2, 3 |" in text
    assert "wall-clock to 1,500: Stellaris" in text
    assert "2.00x sooner, goal 1.5x: undecided (3 of 5 seeds landed; so far: met)" in text
    assert "P(Stellaris > sync)" in text
    for figure in ("hopper-v5.png", "costs.png", "profiles.png"):
        assert (page.parent / "img" / "evaluation" / figure).stat().st_size > 10_000
    first = text
    report.build(results, page, reps=200)
    assert page.read_text() == first  # seeded: the same CSVs give the same page


def test_the_peers_join_the_page_from_their_own_directory(tmp_path: Path) -> None:
    """The modes' and the peers' directories make one page; Hopper's peer goal compares the median wall-clock to
    1,500: CleanRL at 3 s a round is behind Stellaris's 1 s, SB3 at 0.5 s is ahead of it."""
    modes, peers, page = tmp_path / "smoke", tmp_path / "peers", tmp_path / "docs" / "evaluation.md"
    page.parent.mkdir()
    _fixture(modes)
    _fixture(peers, (("cleanrl", 3.0), ("sb3", 0.5)))
    report.build([modes, peers, tmp_path / "not-yet"], page, reps=200)
    text = page.read_text()
    assert "| cleanrl | 1, 2, 3 |" in text and "| sb3 | 1, 2, 3 |" in text
    cleanrl = next(line for line in text.splitlines() if "against cleanrl" in line)
    sb3 = next(line for line in text.splitlines() if "against sb3" in line)
    assert "(3 of 5 seeds landed; so far: met)" in cleanrl and "so far: **missed**" in sb3
    assert "Peers (`cleanrl`, `sb3`, `rllib`)" in text
    # a directory named after a plan reports its progress: the fixture's 6 runs are 6 of the smoke plan's 10 cells
    assert "- Plan `smoke`: 6 of 10 cells landed, 0.6 h of runs." in text  # 3 x 250 s and 3 x 495 s
    assert "- Plan `peers`: 6 of 33 cells landed, 0.7 h of runs." in text
    with pytest.raises(Exception, match=r"no cells\.csv in"):
        report.load([tmp_path / "not-yet"])


def test_a_campaign_can_run_one_env_first(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    runner = CliRunner()
    hopper = runner.invoke(
        campaign.app, ["run", "modes", "--env", "Hopper-v5", "--dry-run", "--results", str(tmp_path)]
    )
    assert hopper.exit_code == 0 and "modes: 25 cells, 0 finished, 25 to run" in hopper.output
    assert "walker2d" not in hopper.output
    typo = runner.invoke(campaign.app, ["run", "modes", "--env", "Hoper", "--dry-run", "--results", str(tmp_path)])
    assert typo.exit_code == 2 and "'Hoper' is not in the plan 'modes'" in " ".join(typo.output.split())


def test_the_scale_plan_models_each_n_with_its_seeds() -> None:
    cells = campaign.plan_cells("scale")
    # N = 1 and 4: 5 seeds; N = 2, 8 and 16: 3; each for stellaris, sync and async
    assert len(cells) == 3 * (5 + 5 + 3 * 3) == len({c.id for c in cells})
    ids = {c.id for c in cells}
    assert "hopper-v5-ppo-stellaris-n4-s5" in ids and "hopper-v5-ppo-sync-n8-s4" not in ids
    cmd = cells[0].command(Path("o"))
    assert cmd[3] == "plan" and cmd[cmd.index("--learners") + 1] == "1" and cells[0].starts_over
    assert cmd[cmd.index("--apply-per-gradient-s") + 1] == "0.0001"


def test_a_measured_cell_runs_only_on_the_machine_its_env_ran_on(tmp_path: Path) -> None:
    """Wall-clock compares only within one machine, env by env across the measured plans: Hopper's landed cells of
    another machine (here the peers') refuse a Hopper cell of the modes, through `run` (exit 2, naming both
    machines) unless --other-machine; another env, cells of this machine, and modelled cells run."""
    from typer.testing import CliRunner

    other = "Some Other CPU, 64 cores, 1 GiB"
    modes, peers = tmp_path / "modes", tmp_path / "peers"
    campaign.write_csv(
        peers / "cells.csv", campaign.INDEX_COLUMNS, [{"cell": "x", "env": "Hopper-v5", "machine": other}]
    )
    cells = campaign.plan_cells("modes")
    hopper = [c for c in cells if c.env == "Hopper-v5"]
    assert campaign.elsewhere(cells, modes) == {"Hopper-v5": [other]}
    with pytest.raises(typer.BadParameter, match=f"Hopper-v5 on '{other}'"):
        campaign._check_machine(hopper, modes)
    campaign._check_machine([c for c in cells if c.env == "Walker2d-v5"], modes)
    args = ["run", "modes", "--env", "Hopper-v5", "--dry-run", "--results", str(modes)]
    refused = CliRunner().invoke(campaign.app, args, env={"COLUMNS": "300"})
    assert refused.exit_code == 2 and "--other-machine" in " ".join(refused.output.split())
    assert CliRunner().invoke(campaign.app, [*args, "--other-machine"]).exit_code == 0
    walker = ["run", "modes", "--env", "Walker2d-v5", "--dry-run", "--results", str(modes)]
    assert CliRunner().invoke(campaign.app, walker).exit_code == 0
    scale = [c for c in campaign.plan_cells("scale") if c.learners]
    calibrated = [replace(c, args=(*c.args, "--calibrate", "r")) for c in scale[:2]]
    assert campaign.elsewhere(calibrated, modes) == {}  # a calibrated modelled cell's clock is its calibration's
    here = {"cell": "y", "env": "Hopper-v5", "machine": machine.describe()}
    campaign.write_csv(modes / "cells.csv", campaign.INDEX_COLUMNS, [here])
    campaign._check_machine(hopper, modes)


def test_the_remedies_plan_changes_stellaris_as_each_remedy_says() -> None:
    """Each remedy's cells are Stellaris's modelled cells with its flags; its id and results mode name it."""
    cells = campaign.plan_cells("remedies")
    assert len(cells) == 3 * sum(map(len, campaign.REMEDY_LEARNERS.values()))
    assert len(cells) == len({c.id for c in cells}) and "hopper-v5-ppo-stellaris-notrunc-n16-s3" in {
        c.id for c in cells
    }
    each = next(c for c in cells if c.variant == "each" and c.learners == 8 and c.seed == 2)
    assert each.id == "hopper-v5-ppo-stellaris-each-n8-s2" and each.label == "stellaris-each"
    cmd = each.command(Path("o"))
    assert cmd[cmd.index("--mode") + 1] == "stellaris" and cmd[cmd.index("--learners") + 1] == "8"
    assert "stellaris.optimizer_steps=each" in cmd and cmd[cmd.index("--apply-per-gradient-s") + 1] == "0.00015"
    notrunc = next(c for c in cells if c.variant == "notrunc")
    assert "stellaris.truncation=false" in notrunc.command(Path("o"))
    cap = next(c for c in cells if c.variant == "cap" and c.learners == 16)
    assert "stellaris.max_aggregate=16" in cap.command(Path("o"))  # the cap is the cell's N


def test_an_index_from_before_a_column_gets_it_blank(tmp_path: Path) -> None:
    index = tmp_path / "cells.csv"
    old = [c for c in campaign.INDEX_COLUMNS if c != "learners"]
    campaign.write_csv(index, old, [{c: "x" for c in old}])
    campaign.write_csv(index, campaign.INDEX_COLUMNS, [{c: "y" for c in campaign.INDEX_COLUMNS}], append=True)
    with index.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == campaign.INDEX_COLUMNS
    assert rows[0]["learners"] == "" and rows[0]["cell"] == "x" and rows[1]["learners"] == "y"
    campaign.write_csv(index, ["extra"], [])  # a file of some other table: refused, not rewritten
    with pytest.raises(ValueError, match=r"columns \['extra'\]"):
        campaign.write_csv(index, campaign.INDEX_COLUMNS, [], append=True)
    assert index.read_text() == "extra\n"


def test_a_real_scale_cell_lands_the_models_rows(tmp_path: Path) -> None:
    """Two modelled rounds of Hopper at N = 1 through `stellaris plan`: the model's clock and cost land as a cell's."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    cmd = [sys.executable, "-m", "experiments.campaign", "run", "scale", "--seeds", "2", "--steps", "4096"]
    cmd += ["--results", str(results), "--runs", str(runs), "--limit", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with (results / "hopper-v5-ppo-stellaris-n1-s2.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [1, 2] and int(rows[-1]["env_steps"]) == 4096
    assert float(rows[-1]["wall_s"]) > float(rows[0]["wall_s"]) > 0 and float(rows[-1]["cost"]) > 0
    assert int(rows[-1]["eval_episodes"]) == 10 and float(rows[-1]["staleness_mean"]) >= 0
    with (results / "cells.csv").open(newline="") as f:
        assert [(r["cell"], r["learners"]) for r in csv.DictReader(f)] == [("hopper-v5-ppo-stellaris-n1-s2", "1")]


def test_the_scale_page_groups_by_n_and_speaks_to_its_goals(tmp_path: Path) -> None:
    """Modelled runs at N = 2 and 4: a section per N, the sweep figure, and at N = 4 the cost and async goals (3 of
    the plan's 5 seeds there, so undecided; N = 2 is not held to them)."""
    results, page = tmp_path / "scale", tmp_path / "docs" / "scale.md"
    page.parent.mkdir()
    _fixture(results, (("stellaris", 1.0), ("sync", 2.0), ("async", 1.0)), learners=2)
    _fixture(results / "n4", (("stellaris", 0.5), ("sync", 2.0), ("async", 0.5)), learners=4)
    report.build([results, results / "n4"], page, title="Scale model", reps=200)
    text = page.read_text()
    assert text.startswith("# Scale model") and "## Hopper-v5, N = 2" in text and "## Hopper-v5, N = 4" in text
    assert "- Modelled runs (N learners): `stellaris plan --learners N`" in text
    cost = next(line for line in text.splitlines() if "N = 4: cost to 500k" in line)
    assert "0.25x, goal at most 0.7x: undecided (3 of 5 seeds landed; so far: met)" in cost  # 0.5 s a round vs 2 s
    assert "N = 4, equal env steps (500k): Stellaris's evaluation IQM" in text and "against async's" in text
    assert "N = 2: cost" not in text
    n4_sync = next(line for line in text.split("## Hopper-v5, N = 4")[1].splitlines() if line.startswith("| sync |"))
    assert n4_sync.endswith("| 8 | 0.50 |")  # a modelled section says how many updates a round, and how stale
    assert "updates a round" not in text.split("## Hopper-v5, N = 2")[0]  # not in the goals above the sections
    n2 = next(line for line in text.splitlines() if "N = 2, wall-clock to 1,500" in line)
    assert "undecided (3 of 3" not in n2 and "goal 1.5x: met" in n2  # N = 2's plan holds 3 seeds: decided
    assert (page.parent / "img" / "scale" / "sweep.png").stat().st_size > 10_000


def test_the_queue_lists_its_steps_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing landed yet, no calibration run: every step says what it would run; the modelled steps are skipped,
    naming the run they lack, and the queue goes on to the next."""
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(campaign.app, ["queue", "--dry-run"], env={"COLUMNS": "300"}).output
    steps = [line for line in out.splitlines() if " cells, " in line or "skipped" in line]
    modelled = ["scale (every env)", "remedies (every env)"]
    assert [s.split(":")[0] for s in steps] == ["modes", "peers", *modelled, "modes", "peers", "atari"]
    assert steps[0] == "modes: 25 cells, 0 finished, 25 to run" and steps[1] == "peers: 15 cells, 0 finished, 15 to run"
    assert "runs/stellaris-s1 has no" in steps[2] and "runs/stellaris-s1 has no" in steps[3]
    assert steps[4] == "modes: 55 cells, 0 finished, 55 to run"


def _hopper_calibration(run: Path, mode: str) -> Path:
    """A one-learner Hopper run directory of the campaign's job (the fast preset) in `mode`: 2 ms a task's compute,
    1 ms its overhead, 2 ms an apply, 0.5 s a collection, in each round after the first. A sync learner waits for
    each apply, so its learning phase holds the applies too."""
    run.mkdir(parents=True)
    config = {"env": "Hopper-v5", "preset": "fast", "mode": mode, "learners": 1, "rounds": 3}
    (run / "config.yaml").write_text(yaml.safe_dump({"config": config}))
    columns = ["round_id", "learners", "duration", "actor_time", "learner_compute_time", "gradients_applied"]
    columns += ["learner_time", "learner_wait_time", "cache_time", "parameter_compute_time", "aggregations"]
    # 320 tasks: compute 0.64 s, 1 ms a task beyond it (0.32 s); the learner busy 0 of the 0.64 s cache time, so
    # the parameter function's 0.64 s over 320 applies: 2 ms; the phase 0.96 s, or 1.6 s with the applies in it
    duration = 0.5 + 0.96 + (0.64 if mode == "sync" else 0.0)
    with (run / "info.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([[k, 1, duration, 0.5, 0.64, 320, 0.64, 0.0, 0.64, 0.0, 320] for k in (1, 2, 3)])
    return run


def test_sync_scale_cells_take_their_jitter_from_stellaris_runs_with_arrivals(tmp_path: Path) -> None:
    """Each mode's cells are calibrated by its own runs; sync's also take the tasks' jitter from the Stellaris runs
    that recorded their gradients' arrivals (a sync run's own arrivals hold its applies), and none without them."""
    stellaris, sync = (
        _hopper_calibration(tmp_path / "stellaris", "stellaris"),
        _hopper_calibration(tmp_path / "sync", "sync"),
    )
    plain = _hopper_calibration(tmp_path / "plain", "stellaris")
    by_mode = campaign._calibration_by_mode([stellaris, sync, plain])
    assert by_mode["stellaris"] == ("--calibrate", str(stellaris), "--calibrate", str(plain))
    assert by_mode["sync"] == ("--calibrate", str(sync))  # no Stellaris run recorded its arrivals
    (stellaris / "gradients.csv").write_text("gradient_id,task_id,round,base_version,applied_version\n")
    by_mode = campaign._calibration_by_mode([stellaris, sync, plain])
    assert by_mode["sync"] == ("--calibrate", str(sync), "--jitter-from", str(stellaris))


def test_calibrated_scale_cells_run_side_by_side_and_others_do_not(tmp_path: Path) -> None:
    """Two calibrated modelled cells at once, each by runs of its own mode: both land, each with its own row in the
    index, and their modelled clock is the calibration's (their rounds as long whatever else ran); cells that are
    not calibrated are refused `--jobs`, naming one, and a mode without a calibration run is named."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    calibration = [_hopper_calibration(tmp_path / mode, mode) for mode in ("stellaris", "sync", "async")]
    base = [sys.executable, "-m", "experiments.campaign", "run", "scale", "--seeds", "2", "--steps", "4096"]
    base += ["--results", str(results), "--runs", str(runs), "--limit", "2", "--jobs", "2"]
    wide = {**os.environ, "COLUMNS": "400"}  # an error on one line, whatever the terminal
    refused = subprocess.run(base, capture_output=True, text=True, timeout=300, env=wide)
    assert refused.returncode == 2 and "hopper-v5-ppo-stellaris-n1-s2 is not a calibrated" in refused.stderr
    flags = [arg for run in calibration for arg in ("--calibrate", str(run))]
    lacking = subprocess.run([*base, *flags[:2]], capture_output=True, text=True, timeout=300, env=wide)
    assert lacking.returncode == 2 and "no calibration run of mode 'async'" in lacking.stderr, lacking.stderr
    done = subprocess.run([*base, *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with (results / "cells.csv").open(newline="") as f:
        assert sorted(r["cell"] for r in csv.DictReader(f)) == [
            "hopper-v5-ppo-stellaris-n1-s2",
            "hopper-v5-ppo-sync-n1-s2",
        ]
    # round 2: a 0.5 s collection, then 320 tasks of 3 ms (2 ms of compute, 1 ms beyond; no jitter calibrated: no
    # gradients.csv). Stellaris's learner claims ahead, so the 2 ms applies overlap its tasks; sync's waits for
    # each step's apply: 5 ms a task
    for mode, task_s in (("stellaris", 0.003), ("sync", 0.005)):
        with (results / f"hopper-v5-ppo-{mode}-n1-s2.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        second = float(rows[1]["wall_s"]) - float(rows[0]["wall_s"])
        assert second == pytest.approx(0.5 + 320 * task_s, rel=0.01), (mode, second)
