"""`stellaris plan`'s body (docs/scale-model.md#running-stellaris-plan): its inputs checked before anything is
computed (one line naming what is wrong, as `stellaris train` checks its own), then one modelled run per N with a
progress bar, a table per N, the CSVs, and with `--compare RUN_DIR` the round-by-round comparison with a real run.

The job is `stellaris train`'s: the same `TrainConfig` (flags over the defaults, or over a run's config.yaml with
`--compare`), one per N. torch and the functions load only once every input has passed (`simulate`, imported then).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contract.jobspec import JobSpec, resolve
from contract.knobs import Rule
from stellaris.config import ConfigError, TrainConfig, load_config
from stellaris.plan.job import PlanJob, plan_job
from stellaris.plan.latency import (
    CalibrationRun,
    LatencyModel,
    Overheads,
    RoundTiming,
    arrival_stamps,
    calibrated_overheads,
)
from stellaris.plan.report import (
    RoundRow,
    Summary,
    compare_rows,
    number,
    read_info,
    rows_file,
    summarize,
    write_comparison,
    write_rows,
    write_summaries,
)
from stellaris.train_options import parsed_sets

DEFAULT_LEARNERS = "1,2,4,8,16"
MAX_LEARNER_COUNTS = 32  # distinct N in one plan: each is a whole modelled run
MAX_CALIBRATION_RUNS = 16  # real runs one --calibrate pools: each is read whole


@dataclass(frozen=True)
class PlanRequest:
    """What `stellaris plan` was given: `train` holds the TrainConfig fields given (the job), `latency` the latency
    knobs given (LatencyModel's fields), `learners` the --learners values as typed."""

    train: dict[str, Any] = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)
    learners: list[str] = field(default_factory=list)
    latency: dict[str, float | bool] = field(default_factory=dict)
    eval_episodes: int = 3
    eval_every: int = 0
    task_s: float | None = None
    collect_s: float | None = None
    apply_s: float | None = None
    compare: Path | None = None
    calibrate: list[Path] = field(default_factory=list)
    jitter_from: list[Path] = field(default_factory=list)
    out: Path = Path("plan")


@dataclass(frozen=True)
class Planned:
    """The checked plan: one job per N, and the real run's info.csv rows with --compare."""

    jobs: list[PlanJob]
    info: list[dict[str, str]] | None = None
    overheads: Overheads | None = None  # measured by --calibrate


def learner_counts(values: Sequence[str]) -> list[int]:
    """--learners as given (repeated, each a comma list) -> the distinct counts, in order; ConfigError naming a bad
    one."""
    counts: list[int] = []
    for part in (p.strip() for value in values for p in value.split(",")):
        if not part:
            continue  # "1,2," or a stray comma
        if not part.isdigit() or int(part) < 1:
            raise ConfigError(f"--learners: {part!r} is not a whole number of learners (1 or more), e.g. 1,2,4,8,16")
        if int(part) not in counts:
            counts.append(int(part))
    if not counts:
        raise ConfigError("--learners: give at least one learner count, e.g. --learners 1,2,4")
    if len(counts) > MAX_LEARNER_COUNTS:
        raise ConfigError(f"--learners: {len(counts)} counts; at most {MAX_LEARNER_COUNTS} in one plan")
    return counts


def latency_model(given: dict[str, float | bool]) -> LatencyModel:
    """The latency knobs given over LatencyModel's defaults; ConfigError naming the flag of a bad one."""
    try:
        return LatencyModel.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "latency model"
        raise ConfigError(f"{name}: {error['msg']}, got {error.get('input')!r}") from None


def _check_numbers(request: PlanRequest) -> None:
    for flag, value in (
        ("--task-s", request.task_s),
        ("--collect-s", request.collect_s),
        ("--apply-s", request.apply_s),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}: give a positive number of seconds, got {value!r}")
    for flag, count in (("--eval-episodes", request.eval_episodes), ("--eval-every", request.eval_every)):
        if count < 0:
            raise ConfigError(f"{flag}: give 0 or more, got {count}")


def _run_source(run_dir: Path, flag: str = "--compare") -> tuple[Path, list[dict[str, str]]]:
    """A real run's config.yaml and info.csv rows; ConfigError naming the flag and what is missing."""
    if not run_dir.is_dir():
        raise ConfigError(f"{flag}: {run_dir} is not a directory (give a run directory, e.g. runs/CartPole-v1-...)")
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{flag}: {run_dir} has no config.yaml: not a run directory")
    try:
        return config, read_info(run_dir / "info.csv")
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


# What decides a task's compute, a batch's collection and how tasks wait for applies: a calibration run must match
# the planned job in each.
CALIBRATION_FIELDS = (
    ("mode", lambda spec: spec.algo.stellaris.rule.value),
    ("env", lambda spec: spec.env_id),
    ("num_envs", lambda spec: spec.num_envs),
    ("actor_steps", lambda spec: spec.actor_steps),
    ("algo", lambda spec: spec.algo.algo),
    ("network", lambda spec: spec.algo.network),
    ("num_minibatches", lambda spec: spec.algo.num_minibatches),
)


def _gradient_arrivals(run_dir: Path) -> list[tuple[int, str]]:
    """A run's (round, gradient id) pairs from its gradients.csv; none when it has no such file."""
    path = run_dir / "gradients.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [(int(r["round"]), r["gradient_id"]) for r in csv.DictReader(f) if r.get("gradient_id")]


def _function_spans(run_dir: Path) -> list[tuple[float, float]]:
    """A run's learner and parameter invocations' (start, end), epoch seconds, from its invocations.csv; none when it
    has no such file."""
    path = run_dir / "invocations.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["function"].endswith(("-learner", "-parameter"))]
    return [(float(r["start"]), float(r["end"])) for r in rows if r.get("start") and r.get("end")]


# --jitter-from takes runs of any rule: a task computes the same gradient under each
JITTER_FIELDS = tuple((name, field_of) for name, field_of in CALIBRATION_FIELDS if name != "mode")


def _calibration_run(run_dir: Path, planned: JobSpec, flag: str) -> tuple[CalibrationRun, JobSpec]:
    """A real run's rows, arrivals and invocations, and its job; ConfigError naming the first field in which its job
    differs from the planned one in what its timings depend on (a Hopper run does not calibrate a CartPole plan, nor
    a Stellaris run a sync one; --jitter-from takes any rule)."""
    config, rows = _run_source(run_dir, flag)
    try:
        spec = resolve(load_config(config, {}, section="config").job_request("calibration"))
    except (ConfigError, ValidationError) as exc:
        raise ConfigError(f"{flag}: {run_dir}: its config.yaml does not load: {exc}") from None
    for name, field_of in JITTER_FIELDS if flag == "--jitter-from" else CALIBRATION_FIELDS:
        if field_of(spec) != field_of(planned):
            raise ConfigError(
                f"{flag}: {run_dir} ran {name} {field_of(spec)!r}, the plan {field_of(planned)!r}: calibrate "
                "from a run of the same job"
            )
    run = CalibrationRun(
        [{k: number(v) for k, v in r.items()} for r in rows],
        arrival_stamps(_gradient_arrivals(run_dir)),
        _function_spans(run_dir),
    )
    return run, spec


def _calibration_runs(paths: Sequence[Path], planned: JobSpec, flag: str) -> list[tuple[CalibrationRun, JobSpec]]:
    if len(paths) > MAX_CALIBRATION_RUNS:
        raise ConfigError(f"{flag}: {len(paths)} runs; at most {MAX_CALIBRATION_RUNS}")
    return [_calibration_run(run_dir, planned, flag) for run_dir in paths]


def _calibrated(request: PlanRequest, planned: JobSpec | None) -> tuple[LatencyModel, Overheads | None]:
    """The latency knobs given, over what --calibrate and --jitter-from measured (a flag given wins), over the
    defaults; and what --calibrate measured (its compute, collection and apply seconds become the jobs' unless
    given)."""
    if planned is None:
        return latency_model(request.latency), None
    knobs: dict[str, float | bool] = {}
    measured = None
    if request.calibrate:
        runs = [run for run, _ in _calibration_runs(request.calibrate, planned, "--calibrate")]
        try:
            measured = calibrated_overheads(runs, waits_for_applies=planned.algo.stellaris.rule is Rule.SYNC)
        except ValueError as exc:
            raise ConfigError(f"--calibrate: {', '.join(map(str, request.calibrate))}: {exc}") from None
        knobs["task_overhead_s"] = measured.task_overhead_s
        if measured.jitter_sigma is not None:
            knobs["jitter_sigma"] = measured.jitter_sigma
    if request.jitter_from:
        knobs["jitter_sigma"] = _jitter_from(request.jitter_from, planned)
    return latency_model({**knobs, **request.latency}), measured


def _jitter_from(paths: Sequence[Path], planned: JobSpec) -> float:
    """The tasks' jitter σ that runs of the same job under a rule other than sync measured (`arrival_jitter`): a task
    computes the same gradient under any rule, but a sync learner's arrivals also hold its applies and its waits."""
    runs = []
    for run_dir, (run, spec) in zip(paths, _calibration_runs(paths, planned, "--jitter-from"), strict=True):
        if spec.algo.stellaris.rule is Rule.SYNC:
            raise ConfigError(
                f"--jitter-from: {run_dir} ran mode 'sync': its arrivals hold its applies and waits, not its tasks "
                "alone; give a run of another rule"
            )
        runs.append(run)
    try:
        sigma = calibrated_overheads(runs).jitter_sigma
    except ValueError as exc:
        raise ConfigError(f"--jitter-from: {', '.join(map(str, paths))}: {exc}") from None
    if sigma is None:
        raise ConfigError(f"--jitter-from: {', '.join(map(str, paths))}: no gradients.csv with two arrivals a round")
    return sigma


def _drawn_timings(per_round: Sequence[RoundTiming], request: PlanRequest) -> tuple[RoundTiming, ...]:
    """The calibration rounds a modelled round draws its timings from, each with the flags given in place of what it
    measured."""
    given = {
        "compute_s": request.task_s,
        "collect_s": request.collect_s,
        "apply_s": request.apply_s,
        "task_overhead_s": request.latency.get("task_overhead_s"),
    }
    fixed = {name: float(value) for name, value in given.items() if value is not None}
    return tuple(replace(timing, **fixed) for timing in per_round)


def plan(request: PlanRequest) -> Planned:
    """Every input checked, and the job of each N made, before anything runs; ConfigError names the first problem."""
    _check_numbers(request)
    sets = parsed_sets(request.sets)
    source, info, rounds = None, None, None
    given_length = request.train.get("rounds") is not None or request.train.get("total_steps") is not None
    if request.compare is None and not given_length:
        raise ConfigError("give --rounds or --total-steps: the model runs a planned number of rounds")
    if request.compare is not None:
        source, info = _run_source(request.compare)
        rounds = None if given_length else len(info)  # the real run's rounds, under its own plan
    section = "config" if source is not None else None

    def config(learners: int | None) -> TrainConfig:
        flags = request.train if learners is None else {**request.train, "learners": learners}
        return load_config(source, flags, section=section, sets=sets)

    counts = learner_counts(request.learners) if request.learners else None
    if counts is None:
        counts = [config(None).learners] if source is not None else learner_counts([DEFAULT_LEARNERS])
    planned = resolve(config(1).job_request("plan")) if request.calibrate or request.jitter_from else None
    latency, overheads = _calibrated(request, planned)
    timings = _drawn_timings(overheads.per_round, request) if overheads is not None else ()

    jobs = [
        plan_job(
            config(n),
            latency=latency,
            rounds=rounds,
            eval_episodes=request.eval_episodes,
            eval_every=request.eval_every,
            task_s=request.task_s,
            collect_s=request.collect_s,
            apply_s=request.apply_s,
            round_timings=timings,
        )
        for n in counts
    ]
    return Planned(jobs, info, overheads)


def _number(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def summary_table(summaries: Sequence[Summary], title: str) -> Table:
    table = Table(title=title)
    for name in ("N", "wall s", "cost $", "return", "eval", "staleness", "applied", "flushes"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(
            str(s.learners),
            f"{s.wall_clock_s:.1f}",
            f"{s.cost:.5f}",
            _number(s.final_return, ".1f"),
            _number(s.eval_return, ".1f"),
            _number(s.staleness_mean, ".2f"),
            str(s.gradients_applied),
            str(s.flushes),
        )
    return table


def comparison_table(compared: Sequence[dict[str, float | int]]) -> Table:
    table = Table(title="real run / model, round by round")
    table.add_column("round", justify="right")
    shown = [
        ("return", "train_reward_mean", ".1f"),
        ("staleness", "staleness_mean", ".2f"),
        ("applied", "gradients_applied", ".0f"),
        ("round s", "duration", ".2f"),
    ]
    for name, _, _ in shown:
        table.add_column(name, justify="right", no_wrap=True)
    for row in compared:
        cells = [
            f"{_number(float(row[f'real_{key}']), spec)} / {_number(float(row[f'model_{key}']), spec)}"
            for _, key, spec in shown
        ]
        table.add_row(str(row["round_id"]), *cells)
    return table


def _title(job: PlanJob) -> str:
    spec = job.spec
    knobs = spec.algo.stellaris
    return (
        f"{spec.env_id} {spec.algo.algo} {knobs.rule} d={knobs.d} v={knobs.v} ρ={knobs.rho}: "
        f"{job.rounds} round(s) x {job.env_steps_per_round} steps (wall-clock and cost modelled)"
    )


def _calibration_line(o: Overheads, job: PlanJob) -> str:
    """What --calibrate measured (medians), and what the model runs with: each round the timings of one of those
    rounds, with the flags given in their place."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.3f} ms"

    jitter = "not measured" if o.jitter_sigma is None else f"{o.jitter_sigma:.3f}"
    start = "not measured (no gradients.csv or invocations.csv)" if o.start_s is None else ms(o.start_s)
    given = [
        f"{name} {value}"
        for name, value in (("--task-s", job.task_s), ("--collect-s", job.collect_s), ("--apply-s", job.apply_s))
        if value is not None
    ]
    return (
        f"calibrated over {o.rounds} rounds (medians): a task's compute {ms(o.compute_s)} and overhead "
        f"{ms(o.task_overhead_s)}, an apply {ms(o.apply_s)} in all, a batch's collection {o.collect_s:.3f} s, a "
        f"round's start {start}, the tasks' jitter σ {jitter}; each modelled round takes one of those rounds' timings"
        f"{' (' + ', '.join(given) + ' in their place)' if given else ''}, σ {job.latency.jitter_sigma:.3f}"
    )


def run(planned: Planned, out: Path, console: Console) -> int:
    """Run each N's modelled run with a progress bar, write its CSV as it finishes, then the summary (and the
    comparison); print the tables. Returns the exit code."""
    from stellaris.plan.simulate import simulate  # torch and the functions: only once the inputs have passed

    out.mkdir(parents=True, exist_ok=True)
    if planned.overheads is not None:
        console.print(_calibration_line(planned.overheads, planned.jobs[0]))
    began = time.perf_counter()
    summaries: list[Summary] = []
    all_rows: list[list[RoundRow]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("modelling", total=sum(job.rounds for job in planned.jobs))
        for job in planned.jobs:
            progress.update(bar, description=f"N={job.learners}")
            rows = simulate(job, on_round=lambda row: progress.advance(bar))
            write_rows(rows_file(out, job.learners), rows)
            all_rows.append(rows)
            summaries.append(summarize(rows))
    write_summaries(out / "summary.csv", summaries)
    console.print(summary_table(summaries, _title(planned.jobs[0])))
    if planned.info is not None:  # against the first N modelled: the run's own unless --learners says otherwise
        compared = compare_rows(planned.info, all_rows[0])
        write_comparison(out / "compare.csv", compared)
        console.print(comparison_table(compared))
    seconds = time.perf_counter() - began
    console.print(f"wrote {len(summaries)} run(s)' rounds and summary.csv to {out}/ ({seconds:.0f} s on this machine)")
    return 0
