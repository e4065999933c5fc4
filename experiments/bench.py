"""`python -m experiments.bench`: every benchmark, side by side in one run, as one table of ratios
(docs/experiments.md).

1. cache: our codec (SET/GET and the stream path) vs pickle + Redis and vs raw bytes, same Redis;
2. gateway: warm no-op invocations through the gateway vs direct to the same instance;
3. actor sampling: the actor function's env steps/s vs a bare gymnasium loop with the same policy;
4. cores: Redis round trips with the client and the server on two cores vs on one (bench_cores.py): the price of a
   wake-up across cores, which every synchronous call to Redis pays twice;
5. end-to-end: `stellaris train` env steps/s vs a single-process PPO loop written the plain way (plain_ppo.py),
   same hyperparameters (fast preset), same machine, alternated A B A B A B and reported as the median ratio over
   the pairs with its min–max. The same `stellaris train` runs give the platform overhead share of a round's
   function time, when info.csv has the columns the Redis round trips per applied gradient, and the CPU per env
   step of all the run's processes (read from /proc as rounds 1 and N land) against the plain loop's, also split by
   process (actors, learners, parameter, Redis, gateway, control plane) against the plain loop's collection and
   update.

    python -m experiments.bench --only end-to-end --pairs 3 --rounds 21 --json bench.json
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from experiments import bench_actor, bench_cache, bench_cores, bench_gateway, plain_ppo
from experiments.proc_cpu import tree_cpu_by_kind
from experiments.summary import read_info

PARTS = ("cache", "gateway", "actor", "cores", "end-to-end")
SIDES = ("ours", "plain")  # A, B of each end-to-end pair
REPORT_PAIRS_MIN = 3  # fewer A/B pairs than this and the end-to-end rows are marked preliminary
REPORT_STEADY_ROUNDS_MIN = 20  # likewise for steady rounds (rounds 2..N) per side
OLD_TRIPS_PER_GRADIENT = 33.0  # Redis commands per learner+parameter pair, measured before the protocol rewrite
POLL_S = 0.2  # how often a `stellaris train` run's info.csv is looked at, to read its CPU as rounds 1 and N land


@dataclass
class Row:
    benchmark: str
    ours: str
    baseline: str
    ratio: float
    note: str = ""


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements with their min–max."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values to aggregate")
        return cls(statistics.median(values), min(values), max(values))


@dataclass
class Pair:
    """One A/B pair of the end-to-end benchmark: a `stellaris train` run (its info.csv) and a plain PPO run."""

    info: list[dict[str, float]]
    plain: list[plain_ppo.RoundResult]
    ours_cpu_by_kind: dict[str, float] | None = None  # CPU s of the run's processes over `cpu_rows`, by `process_kind`

    @property
    def cpu_rows(self) -> list[dict[str, float]]:
        """The rows the CPU readings span, round 1's to round N-1's: once round N's row is written, the job stops its
        processes at once, and a reaped one's CPU would count with its parent's kind."""
        return self.info[:-1]

    @property
    def ours_cpu_s(self) -> float | None:
        """CPU seconds of all the run's processes over rounds 2..N (None: not read)."""
        return None if self.ours_cpu_by_kind is None else sum(self.ours_cpu_by_kind.values())


def cache_rows(seconds: float, repeats: int, console: Console) -> list[Row]:
    with bench_cache.connect() as cache:
        results = bench_cache.run(cache, seconds, repeats, console)
    rows = []
    for payload, label in bench_cache.LABELS.items():
        by = {r.path: r for r in results if r.payload == payload}
        pickle_r, raw_r = by["pickle + Redis"], by["raw SET/GET"]
        for ours_path in ("ours (codec SET/GET)", "ours (stream)", "ours (learner claim)"):
            if ours_path not in by:
                continue  # a batch has no claim
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


def cores_rows(seconds: float, repeats: int, console: Console) -> list[Row]:
    """Round trips to Redis with the client and the server on two cores (as a run places them) against one."""
    if len(os.sched_getaffinity(0)) < 2:
        console.log("cores: skipped, this process may run on one core only")
        return []
    with bench_cache.connect() as cache:
        results = bench_cores.measure(cache, seconds, max(repeats, 3), console)
    by = {(r.path, r.side): r for r in results}
    rows = []
    for path in dict.fromkeys(r.path for r in results):
        two, one = by[(path, "two cores")], by[(path, "one core")]
        rows.append(
            Row(
                f"Redis round trip {path}: client and server on two cores vs on one",
                f"{1e6 / two.median_us:,.0f} trips/s ({two.median_us:.0f} µs)",
                f"{1e6 / one.median_us:,.0f} trips/s ({one.median_us:.0f} µs)",
                one.median_us / two.median_us,
                f"alternated {len(two.latencies_us)} times (one core first), medians; two cores min–max "
                f"{min(two.latencies_us):.0f}–{max(two.latencies_us):.0f} µs, one core "
                f"{min(one.latencies_us):.0f}–{max(one.latencies_us):.0f} µs",
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


# A pair's ratio swings ±0.2 with Hopper's episode lengths and the machine's load (one pair: 2 x 4096 steps, ~6 s);
# medians of 3-12 pairs moved 0.82-1.04x between runs, so the actor row takes more, shorter pairs than the others.
ACTOR_PAIRS = 12


def actor_rows(env: str, repeats: int) -> list[Row]:
    with bench_actor.connect_cache() as cache:
        r = bench_actor.measure(cache, env, batches=2, repeats=max(repeats, ACTOR_PAIRS))
    return [
        Row(
            f"actor sampling {env}: actor function vs bare gymnasium loop",
            f"{r.platform_steps_per_s:,.0f} steps/s",
            f"{r.bare_steps_per_s:,.0f} steps/s",
            r.ratio,
            f"median of {len(r.pair_ratios)} A/B pairs, range {min(r.pair_ratios):.2f}-{max(r.pair_ratios):.2f}x; by "
            f"CPU time {r.cpu_ratio:.2f}x; same policy, one thread; ours includes the cache push",
        )
    ]


# --- end-to-end: A/B pairs of `stellaris train` and plain PPO --------------------------------------------------------


def ab_schedule(pairs: int) -> Iterator[tuple[int, str]]:
    """The run order of the end-to-end benchmark, A B A B …: (pair index, side), ours first in every pair."""
    for i in range(pairs):
        for side in SIDES:
            yield i, side


def steady_rate(durations: Sequence[float], steps: Sequence[int]) -> float:
    """Env steps/s over rounds 2..N: round 1 also pays process start-up and warm-up."""
    return sum(steps[1:]) / sum(durations[1:])


def ours_rate(info: list[dict[str, float]]) -> float:
    cumulative = [int(r["env_steps"]) for r in info]
    steps = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
    return steady_rate([r["duration"] for r in info], steps)


def plain_rate(rounds: list[plain_ppo.RoundResult]) -> float:
    return steady_rate([r.seconds for r in rounds], [r.env_steps for r in rounds])


def function_time(steady: list[dict[str, float]]) -> tuple[float, float]:
    """(compute, overhead) seconds summed over rounds; overhead = invocation + cache I/O.

    `learner_wait_time` (learners blocked waiting for work), when info.csv has it, is neither and is left out of both.
    """
    compute = sum(r["learner_compute_time"] + r["parameter_compute_time"] for r in steady)
    overhead = sum(r["invocation_overhead"] + r["cache_time"] for r in steady)
    return compute, overhead


def overhead_share(steady: list[dict[str, float]]) -> float:
    compute, overhead = function_time(steady)
    return overhead / (compute + overhead)


def round_trips(steady: list[dict[str, float]]) -> tuple[float, float] | None:
    """(Redis commands, gradients applied) summed over rounds; None unless every round has both as numbers."""
    keys = ("redis_round_trips", "gradients_applied")
    if not steady or not all(math.isfinite(r.get(k, math.nan)) for r in steady for k in keys):
        return None
    return sum(r["redis_round_trips"] for r in steady), sum(r["gradients_applied"] for r in steady)


def round_trips_row(pairs: list[Pair]) -> Row | None:
    """Redis commands per applied gradient over the steady rounds of every pair; None when info.csv lacks them."""
    per_pair = [round_trips(p.info[1:]) for p in pairs]
    if not per_pair or any(t is None or t[1] <= 0 for t in per_pair):
        return None
    commands, gradients = sum(t[0] for t in per_pair), sum(t[1] for t in per_pair)
    pooled = commands / gradients
    spread = Spread.of([c / g for c, g in per_pair])
    return Row(
        "Redis round trips per gradient (end to end)",
        f"{pooled:.1f} commands/gradient",
        f"{OLD_TRIPS_PER_GRADIENT:.0f} commands/gradient (before the rewrite)",
        pooled / OLD_TRIPS_PER_GRADIENT,
        "round trips of every function and the control plane (counted at each client) / gradients applied, "
        f"steady rounds of {len(pairs)} runs pooled, "
        f"per run {spread.lo:.1f}–{spread.hi:.1f}; baseline = {OLD_TRIPS_PER_GRADIENT:.0f} commands per "
        "learner+parameter pair measured before the rewrite",
    )


def cpu_per_step(pair: Pair) -> tuple[float, float] | None:
    """(ours, plain) CPU seconds per env step over steady rounds (ours 2..N-1, `Pair.cpu_rows`; plain 2..N), every
    process of the run counted; None unless read."""
    if pair.ours_cpu_s is None:
        return None
    ours_steps = pair.cpu_rows[-1]["env_steps"] - pair.cpu_rows[0]["env_steps"]
    plain_cpu = sum(r.cpu_seconds for r in pair.plain[1:])
    plain_steps = sum(r.env_steps for r in pair.plain[1:])
    if ours_steps <= 0 or plain_steps <= 0 or plain_cpu <= 0:
        return None
    return pair.ours_cpu_s / ours_steps, plain_cpu / plain_steps


def cpu_row(pairs: list[Pair]) -> Row | None:
    """CPU per env step, ours (all processes: functions, gateway, control plane, Redis) vs the plain loop's; None
    when a pair lacks the readings."""
    per_pair = [cpu_per_step(p) for p in pairs]
    if not per_pair or any(c is None for c in per_pair):
        return None
    ours = [c[0] for c in per_pair if c is not None]
    plain = [c[1] for c in per_pair if c is not None]
    ratio = Spread.of([o / b for o, b in zip(ours, plain, strict=True)])
    wall = sum(sum(r["duration"] for r in p.cpu_rows[1:]) for p in pairs)
    cores = sum(p.ours_cpu_s or 0.0 for p in pairs) / wall
    return Row(
        "CPU per env step, all processes of the run (steady rounds)",
        f"{statistics.median(ours) * 1e3:.2f} ms/step (median; {cores:.2f} cores busy)",
        f"{statistics.median(plain) * 1e3:.2f} ms/step (median)",
        ratio.median,
        f"per-pair ratio min–max {ratio.lo:.2f}–{ratio.hi:.2f}x; end-to-end ≥ 1.5x on 2 cores needs ≤ 1.33x here "
        "with both cores busy",
    )


# What each process of a `stellaris train` run is, from its command line (first match; the rest: the control plane).
PROCESS_KINDS = (
    ("redis-server", "redis"),
    ("handlers.learner:", "learners"),
    ("handlers.parameter:", "parameter"),
    ("handlers.actor:", "actors"),
    ("functions.actor.loop", "actors"),
    ("-m gateway", "gateway"),
    ("functions.runtime.zygote", "gateway"),  # the process backend's fork server
)
PLATFORM_KINDS = ("redis", "gateway", "control plane")  # what the plain loop has no counterpart for


def process_kind(cmdline: str) -> str:
    return next((kind for needle, kind in PROCESS_KINDS if needle in cmdline), "control plane")


def cpu_by_process_row(pairs: list[Pair]) -> Row | None:
    """Ours' CPU per env step by process, pooled over the pairs, against the plain loop's collection and update:
    where the CPU that the end-to-end ratio needs back goes. None when a pair lacks the readings."""
    if not pairs or any(p.ours_cpu_by_kind is None for p in pairs):
        return None
    steps = sum(p.cpu_rows[-1]["env_steps"] - p.cpu_rows[0]["env_steps"] for p in pairs)
    plain_steps = sum(r.env_steps for p in pairs for r in p.plain[1:])
    collect = sum(r.collect_cpu_seconds for p in pairs for r in p.plain[1:]) / plain_steps
    update = sum(r.cpu_seconds - r.collect_cpu_seconds for p in pairs for r in p.plain[1:]) / plain_steps
    if steps <= 0 or collect <= 0 or update <= 0:
        return None
    ms: dict[str, float] = {}
    for p in pairs:
        for kind, cpu_s in (p.ours_cpu_by_kind or {}).items():
            ms[kind] = ms.get(kind, 0.0) + cpu_s / steps * 1e3
    learning = ms.get("learners", 0.0) + ms.get("parameter", 0.0)
    platform = sum(ms.get(k, 0.0) for k in PLATFORM_KINDS)
    order = ("actors", "learners", "parameter", *PLATFORM_KINDS)
    return Row(
        "CPU per env step by process (pooled steady rounds): learners + parameter vs the plain loop's update",
        " · ".join(f"{k} {ms.get(k, 0.0):.2f}" for k in order) + " ms/step",
        f"collection {collect * 1e3:.2f} · update {update * 1e3:.2f} ms/step",
        learning / (update * 1e3),
        f"actors vs the plain loop's collection {ms.get('actors', 0.0) / (collect * 1e3):.2f}x; redis, gateway and "
        f"control plane {platform:.2f} ms/step, which the plain loop does not have",
    )


def end_to_end_rows(env: str, pairs: list[Pair], train_args: Sequence[str] = ()) -> list[Row]:
    """The overhead-share, round-trips and end-to-end rows from the A/B pairs' results (`train_args`: what our side
    ran with besides the fast preset, named in the end-to-end row)."""
    steady = [p.info[1:] for p in pairs]
    steady_rounds = min(min(len(p.info), len(p.plain)) for p in pairs) - 1
    caveat = ""
    if len(pairs) < REPORT_PAIRS_MIN or steady_rounds < REPORT_STEADY_ROUNDS_MIN:
        caveat = (
            f"PRELIMINARY (below {REPORT_PAIRS_MIN} pairs x {REPORT_STEADY_ROUNDS_MIN} steady rounds, "
            "not for reporting): "
        )

    pooled = [r for rounds in steady for r in rounds]
    compute, overhead = function_time(pooled)
    share = Spread.of([overhead_share(s) for s in steady])
    actor = statistics.mean(r["actor_time"] for r in pooled)
    round_s = statistics.mean(r["duration"] for r in pooled)
    wait = [r["learner_wait_time"] for r in pooled if math.isfinite(r.get("learner_wait_time", math.nan))]
    wait_note = f"; learner wait {statistics.mean(wait):.2f} s/round counted in neither" if wait else ""
    rows = [
        Row(
            "platform overhead share of a round's function time (invocation + cache I/O)",
            f"{overhead / len(pooled):.2f} s/round",
            f"{(compute + overhead) / len(pooled):.2f} s/round of function time",
            share.median,
            f"{caveat}median of {len(pairs)} runs' shares, min–max {share.lo:.1%}–{share.hi:.1%} "
            f"(pooled {overhead / (compute + overhead):.1%}); round {round_s:.2f} s wall, of it {actor:.2f} s "
            f"waiting for the batch{wait_note}",
        )
    ]
    rows += [r for r in (round_trips_row(pairs), cpu_row(pairs), cpu_by_process_row(pairs)) if r is not None]

    ours = [ours_rate(p.info) for p in pairs]
    plain = [plain_rate(p.plain) for p in pairs]
    ratio = Spread.of([o / b for o, b in zip(ours, plain, strict=True)])
    rows.append(
        Row(
            f"end-to-end training {env} (fast preset{' ' + shlex.join(train_args) if train_args else ''}): "
            "stellaris train vs plain single-file PPO",
            f"{statistics.median(ours):,.0f} steps/s (median)",
            f"{statistics.median(plain):,.0f} steps/s (median)",
            ratio.median,
            f"{caveat}median of {len(pairs)} A/B pairs, per-pair ratio min–max {ratio.lo:.2f}–{ratio.hi:.2f}x; "
            f"{steady_rounds} steady rounds per side (rounds 2..N); {_shape(pooled)} vs 1 process",
        )
    )
    return rows


def _shape(rounds: list[dict[str, float]]) -> str:
    """'1 actor x 2 envs, 1 learner' as the runs' info.csv rows say (the learner count is the machine's default)."""

    def counted(key: str, noun: str) -> str:
        values = sorted({int(r[key]) for r in rounds if math.isfinite(r.get(key, math.nan))})
        n = "/".join(map(str, values)) or "?"
        return f"{n} {noun}{'' if values == [1] else 's'}"

    return f"{counted('actors', 'actor')} x {counted('envs_per_actor', 'env')}, {counted('learners', 'learner')}"


def rows_written(info_csv: Path) -> int:
    """Rounds an info.csv holds so far (lines after the header)."""
    try:
        return max(info_csv.read_bytes().count(b"\n") - 1, 0)
    except FileNotFoundError:
        return 0


def run_ours(
    env: str, rounds: int, seed: int, tmp: Path, train_args: Sequence[str] = ()
) -> tuple[list[dict[str, float]], dict[str, float] | None]:
    """One `stellaris train` run of the fast preset (and `train_args`) in its own process: its info.csv rows, and the
    CPU seconds its processes spent between round 1's row and round N-1's (`Pair.cpu_rows`), by `process_kind` (None
    if either was missed)."""
    run = tmp / f"run-{seed}"
    cmd = [sys.executable, "-m", "stellaris.cli", "train", "--env", env, "--preset", "fast"]
    cmd += ["--rounds", str(rounds), "--seed", str(seed), "--out", str(run), *train_args]
    log = tmp / f"log-{seed}.txt"
    first: dict[str, float] | None = None  # the run's CPU seconds as round 1's row lands, then as round N-1's does
    last: dict[str, float] | None = None
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ})
        while proc.poll() is None:
            written = rows_written(run / "info.csv")
            if first is None and written >= 1:
                first = tree_cpu_by_kind(proc.pid, process_kind)
            if last is None and written >= rounds - 1:
                last = tree_cpu_by_kind(proc.pid, process_kind)
            time.sleep(POLL_S)
    if proc.returncode != 0:
        raise RuntimeError(f"stellaris train failed ({proc.returncode}): {log.read_text()[-2000:]}")
    if first is None or last is None:
        return read_info(run), None
    return read_info(run), {k: last.get(k, 0.0) - first.get(k, 0.0) for k in last.keys() | first.keys()}


# The options `run_ours` sets itself: the pairs' runs differ only in what --train-args adds.
BENCH_SET = ("--env", "--preset", "--rounds", "--seed", "--out")


def parse_train_args(text: str) -> list[str]:
    """--train-args as `stellaris train` arguments; raises ValueError naming the problem (bad quoting, an option
    the bench sets itself)."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"--train-args {text!r}: {exc}") from exc
    taken = [a for a in args if a.split("=", 1)[0] in BENCH_SET]
    if taken:
        raise ValueError(f"--train-args {text!r} sets {', '.join(taken)}; the bench sets {', '.join(BENCH_SET)} itself")
    return args


def training_rows(env: str, rounds: int, pairs: int, console: Console, train_args: Sequence[str] = ()) -> list[Row]:
    info: dict[int, list[dict[str, float]]] = {}
    cpu: dict[int, dict[str, float] | None] = {}
    plain: dict[int, list[plain_ppo.RoundResult]] = {}
    with tempfile.TemporaryDirectory(prefix="stellaris-bench-") as tmp:
        for i, side in ab_schedule(pairs):
            console.log(f"end-to-end pair {i + 1}/{pairs}: {side} ({rounds} rounds of the fast preset, seed {i})")
            if side == "ours":
                info[i], cpu[i] = run_ours(env, rounds, i, Path(tmp), train_args)
                console.log(f"  stellaris train: {ours_rate(info[i]):,.0f} steps/s over rounds 2..N")
            else:
                plain[i] = plain_ppo.train(env, rounds, seed=i)
                console.log(f"  plain PPO: {plain_rate(plain[i]):,.0f} steps/s over rounds 2..N")
    return end_to_end_rows(env, [Pair(info[i], plain[i], cpu[i]) for i in range(pairs)], train_args)


# --- output -----------------------------------------------------------------------------------------------------------


def render(rows: list[Row], console: Console) -> None:
    table = Table(title="Stellaris benchmarks: ours vs baseline, measured side by side in one run (ratio = ours/base)")
    for col in ("benchmark", "ours", "baseline", "ratio", "note"):
        table.add_column(col, justify="right" if col == "ratio" else "left")
    for r in rows:
        table.add_row(r.benchmark, r.ours, r.baseline, f"{r.ratio:.2f}x", r.note)
    console.print(table)


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "ours", "baseline", "ratio", "note"])
        w.writerows([r.benchmark, r.ours, r.baseline, f"{r.ratio:.4f}", r.note] for r in rows)


def write_json(rows: list[Row], path: Path) -> None:
    """The table as a JSON list of {benchmark, ours, baseline, ratio, note}; a non-finite ratio is written null."""
    records = [asdict(r) | {"ratio": float(r.ratio) if math.isfinite(r.ratio) else None} for r in rows]
    path.write_text(json.dumps(records, indent=2, ensure_ascii=False) + "\n")


def select_parts(only: str | None, skip: str | None) -> list[str]:
    """The parts to run, in PARTS order: all of them, or those named in `only`, less those named in `skip`."""

    def names(text: str | None) -> set[str]:
        given = {n.strip() for n in (text or "").split(",") if n.strip()}
        if unknown := given - set(PARTS):
            raise typer.BadParameter(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
        return given

    chosen = names(only) or set(PARTS)
    return [p for p in PARTS if p in chosen - names(skip)]


def main(
    seconds: float = typer.Option(0.5, help="length of one timed window (cache, gateway)"),
    repeats: int = typer.Option(3, help="timed windows per path; medians are reported"),
    env: str = typer.Option("Hopper-v5", help="env for the actor and end-to-end benchmarks"),
    rounds: int = typer.Option(
        REPORT_STEADY_ROUNDS_MIN + 1, min=2, help="training rounds per end-to-end run; rounds 2..N are measured"
    ),
    pairs: int = typer.Option(
        REPORT_PAIRS_MIN,
        min=1,
        help=f"end-to-end A/B pairs (ours, plain), alternated; below {REPORT_PAIRS_MIN} rows are marked PRELIMINARY",
    ),
    only: str | None = typer.Option(None, help=f"comma-separated parts to run: {','.join(PARTS)} (default all)"),
    skip: str | None = typer.Option(None, help="comma-separated parts to leave out"),
    csv_path: Path | None = typer.Option(None, "--csv", help="also write the table here as CSV"),
    json_path: Path | None = typer.Option(None, "--json", help="also write the table here as a JSON list of rows"),
    train_args: str = typer.Option(
        "", help='end-to-end: more `stellaris train` options for our side, e.g. "--actor-run-ahead 1"'
    ),
) -> None:
    parts = select_parts(only, skip)
    try:
        extra = parse_train_args(train_args)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--train-args") from exc
    console = Console(stderr=True)
    rows: list[Row] = []
    if "cache" in parts:
        rows += cache_rows(seconds, repeats, console)
    if "gateway" in parts:
        rows += gateway_rows(seconds, repeats, console)
    if "actor" in parts:
        console.log("actor sampling")
        rows += actor_rows(env, repeats)
    if "cores" in parts:
        rows += cores_rows(seconds, repeats, console)
    if "end-to-end" in parts:
        rows += training_rows(env, rounds, pairs, console, extra)
    out = Console()
    render(rows, out if out.is_terminal else Console(width=200))  # logs keep the rows whole
    if csv_path is not None:
        write_csv(rows, csv_path)
    if json_path is not None:
        write_json(rows, json_path)


if __name__ == "__main__":
    typer.run(main)
