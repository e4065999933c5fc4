"""`python -m experiments.bench`: every benchmark, side by side in one run, as one table of ratios (SPEC §9).

1. cache: our codec (SET/GET and the stream path) vs pickle + Redis and vs raw bytes, same Redis;
2. gateway: warm no-op invocations through the gateway vs direct to the same instance;
3. actor sampling: the actor function's env steps/s vs a bare gymnasium loop with the same policy;
4. platform overhead: share of a training round's function time spent in invocation and cache I/O;
5. end-to-end: `stellaris train` env steps/s vs a single-process PPO loop written the plain way (plain_ppo.py),
   same hyperparameters (fast preset), same machine.
"""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from experiments import bench_actor, bench_cache, bench_gateway, plain_ppo
from experiments.summary import read_info


@dataclass
class Row:
    benchmark: str
    ours: str
    baseline: str
    ratio: float
    note: str = ""


def cache_rows(seconds: float, repeats: int, console: Console) -> list[Row]:
    with bench_cache.connect() as cache:
        results = bench_cache.run(cache, seconds, repeats, console)
    rows = []
    for payload, label in (("batch", "Hopper batch 4096 steps"), ("grad", "2x256 MLP gradient")):
        by = {r.path: r for r in results if r.payload == payload}
        pickle_r, raw_r = by["pickle + Redis"], by["raw SET/GET"]
        for ours_path in ("ours (codec SET/GET)", "ours (stream)"):
            ours = by[ours_path]
            for base, name in ((pickle_r, "pickle + Redis"), (raw_r, "raw bytes SET/GET")):
                rows.append(
                    Row(
                        f"cache {label}: {ours_path.removeprefix('ours ').strip('()')} vs {name}",
                        f"{ours.trips_per_s:,.0f} trips/s",
                        f"{base.trips_per_s:,.0f} trips/s",
                        ours.trips_per_s / base.trips_per_s,
                    )
                )
    return rows


def gateway_rows(seconds: float, repeats: int, console: Console) -> list[Row]:
    rows = []
    for conc, stats in bench_gateway.measure(seconds, repeats, console):
        d50, _, drate = stats["direct"]
        g50, g99, grate = stats["gateway"]
        rows.append(
            Row(
                f"gateway no-op invocations, concurrency {conc}",
                f"{grate:,.0f}/s, p50 {g50:.2f} ms",
                f"{drate:,.0f}/s, p50 {d50:.2f} ms (direct)",
                grate / drate,
                f"+{g50 - d50:.2f} ms p50, p99 {g99:.2f} ms",
            )
        )
    return rows


def actor_rows(env: str, repeats: int) -> list[Row]:
    with bench_actor.connect_cache() as cache:
        r = bench_actor.measure(cache, env, batches=4, repeats=repeats)
    return [
        Row(
            f"actor sampling {env}: actor function vs bare gymnasium loop",
            f"{r.platform_steps_per_s:,.0f} steps/s",
            f"{r.bare_steps_per_s:,.0f} steps/s",
            r.ratio,
            "same policy, one thread; ours includes the cache push",
        )
    ]


def _steady_rate(durations: list[float], steps: list[int]) -> float:
    """Env steps/s over rounds 2..N: round 1 also pays process start-up, reported separately."""
    return sum(steps[1:]) / sum(durations[1:])


def training_rows(env: str, rounds: int, console: Console) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="stellaris-bench-") as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "stellaris.cli", "train", "--env", env, "--preset", "fast"]
        cmd += ["--rounds", str(rounds), "--out", str(run)]
        console.log(f"end-to-end: stellaris train ({rounds} rounds of the fast preset)")
        log = Path(tmp) / "log.txt"
        with log.open("w") as f:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ}).returncode
        if code != 0:
            raise RuntimeError(f"stellaris train failed ({code}): {log.read_text()[-2000:]}")
        info = read_info(run)
    cumulative = [int(r["env_steps"]) for r in info]
    steps = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
    ours_rate = _steady_rate([r["duration"] for r in info], steps)
    console.log(f"end-to-end: plain single-process PPO ({rounds} rounds)")
    plain = plain_ppo.train(env, rounds)
    plain_rate = _steady_rate([r.seconds for r in plain], [r.env_steps for r in plain])
    steady = info[1:]
    compute = sum(r["learner_compute_time"] + r["parameter_compute_time"] for r in steady)
    overhead = sum(r["invocation_overhead"] + r["cache_time"] for r in steady)
    actor = statistics.mean(r["actor_time"] for r in steady)
    round_s = statistics.mean(r["duration"] for r in steady)
    return [
        Row(
            "platform overhead share of a round's function time (invocation + cache I/O)",
            f"{overhead / len(steady):.2f} s/round",
            f"{(compute + overhead) / len(steady):.2f} s/round of function time",
            overhead / (compute + overhead),
            f"round {round_s:.2f} s wall, of it {actor:.2f} s waiting for the batch",
        ),
        Row(
            f"end-to-end training {env} (fast preset): stellaris train vs plain single-file PPO",
            f"{ours_rate:,.0f} steps/s",
            f"{plain_rate:,.0f} steps/s",
            ours_rate / plain_rate,
            "2 actors + 4 learner functions vs one process; rounds 2..N",
        ),
    ]


def render(rows: list[Row], console: Console) -> None:
    table = Table(title="Stellaris benchmarks: ours vs baseline, measured side by side in one run (ratio = ours/base)")
    for col in ("benchmark", "ours", "baseline", "ratio", "note"):
        table.add_column(col, justify="right" if col == "ratio" else "left")
    for r in rows:
        table.add_row(r.benchmark, r.ours, r.baseline, f"{r.ratio:.2f}x", r.note)
    console.print(table)


def main(
    seconds: float = typer.Option(0.5, help="length of one timed window (cache, gateway)"),
    repeats: int = typer.Option(3, help="timed windows per path; medians are reported"),
    env: str = typer.Option("Hopper-v5", help="env for the actor and end-to-end benchmarks"),
    rounds: int = typer.Option(5, help="training rounds for the end-to-end benchmark"),
    csv_path: Path | None = typer.Option(None, "--csv", help="also write the table here"),
) -> None:
    console = Console(stderr=True)
    rows = cache_rows(seconds, repeats, console)
    rows += gateway_rows(seconds, repeats, console)
    console.log("actor sampling")
    rows += actor_rows(env, repeats)
    rows += training_rows(env, rounds, console)
    out = Console()
    render(rows, out if out.is_terminal else Console(width=200))  # logs keep the rows whole
    if csv_path is not None:
        with csv_path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["benchmark", "ours", "baseline", "ratio", "note"])
            w.writerows([r.benchmark, r.ours, r.baseline, f"{r.ratio:.4f}", r.note] for r in rows)


if __name__ == "__main__":
    typer.run(main)
