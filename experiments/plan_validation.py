"""`python -m experiments.plan_validation`: the scale model (`stellaris plan`, docs/scale-model.md) against real runs
at N = 1, the only N this 2-core machine runs for real.

For each seed: one real `stellaris train` (its own Redis and gateway, one learner), then `stellaris plan --compare`
on its run directory, which models the same job round by round. The per-round comparisons land in
`results/scale-model/validation/<mode>-s<seed>.csv` (already landed seeds are skipped). With `--calibrate-seeds`
the model takes its timings from real runs of those seeds, held out (`stellaris plan --calibrate`), and the
comparisons land in `results/scale-model/validation-calibrated/`. What the model reads of each real run (its
config, rounds, gradients' arrivals and invocations) is kept in `results/scale-model/real-runs/<mode>-s<seed>/`, to
be committed: a kept run is reused, not run again, and the scale sweep calibrates from the same files. The summary
compares, over seeds, the IQM and 95 % interval of the training return in the last rounds, the mean staleness and
the seconds per round, real against modelled (experiments/stats.py).
"""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from experiments import machine, stats

console = Console(stderr=True)
RESULTS = Path("results/scale-model/validation")
RUNS = Path("runs/plan-validation")
KEPT = Path("results/scale-model/real-runs")
# What `stellaris plan --compare` and `--calibrate` read of a run directory (stellaris/plan/command.py)
KEPT_FILES = ("config.yaml", "info.csv", "gradients.csv", "invocations.csv")
MACHINE_FILE = "machine.txt"  # what it ran on: a calibration is that machine's (docs/scale-model.md#limits)
ROUNDS = 40
LAST = 10  # the rounds whose training return is compared (the run's last 10)


def kept_path(mode: str, seed: int, kept: Path = KEPT) -> Path:
    """Where a real run of `mode` and `seed` is kept."""
    return kept / f"{mode}-s{seed}"


def kept_run(env: str, mode: str, seed: int, rounds: int = ROUNDS, runs: Path = RUNS, kept: Path = KEPT) -> Path:
    """The kept files of a real one-learner `stellaris train` of `rounds` rounds: made in `runs` first (its own Redis
    and gateway, alone on the machine) unless a finished one is kept already."""
    out = kept_path(mode, seed, kept)
    if (out / "info.csv").exists() and len(_rows(out / "info.csv")) >= rounds:
        return out
    run = runs / f"{mode}-s{seed}"
    subprocess.run(["rm", "-rf", str(run), str(out)], check=True)
    train = [sys.executable, "-m", "stellaris.cli", "train", "--env", env, "--mode", mode, "--seed", str(seed)]
    subprocess.run([*train, "--rounds", str(rounds), "--out", str(run)], check=True, capture_output=True)
    out.mkdir(parents=True)
    for name in KEPT_FILES:
        if (run / name).is_file():
            shutil.copyfile(run / name, out / name)
    (out / MACHINE_FILE).write_text(machine.describe() + "\n")
    return out


def run_seed(
    env: str,
    mode: str,
    seed: int,
    rounds: int,
    results: Path,
    runs: Path,
    calibrate: Sequence[Path] = (),
    kept: Path = KEPT,
) -> Path:
    """One real run (kept and reused once finished) and its model, with the timings read off `calibrate` (real runs
    of their own) when given; returns the comparison's CSV."""
    out = results / f"{mode}-s{seed}.csv"
    if out.exists():
        return out
    plan_out = runs / f"{mode}-s{seed}-plan{'-calibrated' if calibrate else ''}"
    t0 = time.monotonic()
    run = kept_run(env, mode, seed, rounds, runs, kept)
    t1 = time.monotonic()
    subprocess.run(["rm", "-rf", str(plan_out)], check=True)
    plan = [sys.executable, "-m", "stellaris.cli", "plan", "--compare", str(run), "--out", str(plan_out)]
    plan += [arg for run_dir in calibrate for arg in ("--calibrate", str(run_dir))]
    subprocess.run(plan, check=True, capture_output=True)
    console.print(f"{mode} seed {seed}: real run {t1 - t0:.0f} s, model {time.monotonic() - t1:.0f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes((plan_out / "compare.csv").read_bytes())
    return out


def _rows(path: Path) -> list[dict[str, float]]:
    with path.open(newline="") as f:
        return [{k: float(v) if v not in ("", None) else math.nan for k, v in r.items()} for r in csv.DictReader(f)]


def summary(paths: list[Path]) -> list[tuple[str, stats.Interval, stats.Interval]]:
    """(quantity, real IQM and interval over seeds, modelled IQM and interval) for each compared quantity."""
    out = []
    for name, rows_of in (
        (f"training return, last {LAST} rounds", lambda rs: rs[-LAST:]),
        ("mean staleness, rounds 2 on", lambda rs: rs[1:]),
        ("seconds per round, rounds 2 on", lambda rs: rs[1:]),
    ):
        column = {"training": "train_reward_mean", "mean": "staleness_mean", "seconds": "duration"}[name.split()[0]]
        per_seed: dict[str, list[float]] = {"real": [], "model": []}
        for path in paths:
            rows = rows_of(_rows(path))
            for side in per_seed:
                per_seed[side].append(float(np.nanmean([r[f"{side}_{column}"] for r in rows])))
        ivs = stats.iqm_intervals(per_seed)
        out.append((name, ivs["real"], ivs["model"]))
    return out


def main(
    env: str = typer.Option("Hopper-v5", help="the env"),
    mode: str = typer.Option("stellaris", help="the rule"),
    seeds: str = typer.Option("1,2,3,4,5", help="comma-separated seeds"),
    rounds: int = typer.Option(ROUNDS, min=LAST + 1, help="rounds per run"),
    calibrate_seeds: str = typer.Option(
        "",
        help="model with the timings read off real runs of these seeds, comma-separated (held out: not --seeds)",
    ),
    results: Path = typer.Option(None, help=f"where the comparisons land (default {RESULTS}, -calibrated with one)"),
    runs: Path = typer.Option(RUNS, help="where the real runs and models run (not committed)"),
    kept: Path = typer.Option(KEPT, help="where what the model reads of each real run is kept (committed)"),
) -> None:
    """Run the seeds not yet compared, then print real against modelled over seeds."""
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    held_out = [int(s) for s in calibrate_seeds.split(",") if s.strip()]
    if shared := sorted(set(held_out) & set(seed_list)):
        raise typer.BadParameter(f"{shared} also in --seeds: hold them out", param_hint="--calibrate-seeds")
    calibrate = [kept_run(env, mode, seed, rounds, runs, kept) for seed in held_out]
    results = results or (RESULTS.with_name(RESULTS.name + "-calibrated") if calibrate else RESULTS)
    paths = [run_seed(env, mode, s, rounds, results, runs, calibrate, kept) for s in seed_list]
    how = f", timings from seeds {', '.join(map(str, held_out))}" if calibrate else ""
    table = Table(
        title=f"scale model at N = 1 against real runs: {env}, {mode}, {len(paths)} seeds, {rounds} rounds{how}"
    )
    for col in ("quantity", "real: IQM [95 % CI]", "model: IQM [95 % CI]", "model inside real's CI"):
        table.add_column(col)
    for name, real, model in summary(paths):
        table.add_row(
            name,
            f"{real.point:.2f} [{real.low:.2f}, {real.high:.2f}]",
            f"{model.point:.2f} [{model.low:.2f}, {model.high:.2f}]",
            "yes" if real.contains(model.point) else "no",
        )
    Console().print(table)


if __name__ == "__main__":
    typer.run(main)
