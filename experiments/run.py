"""`python -m experiments.run SUITE --preset quick|paper --seeds N --out DIR`: a suite of the paper's evaluation.

Output layout under DIR: `runs/<run-id>/` (each a training run directory: info.csv, timeline.csv, invocations.csv,
config, checkpoint, log.txt) and `<suite>/` (runs.csv, summary.csv, PNG figures). Suites share runs under one DIR.
The `rllib` suite's RLlib runs (experiments/rllib_suite.py) use a venv of their own, made on first use.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from experiments import figures, rllib_suite
from experiments.rllib_env import VENV_ENV_VAR, RLlibEnvError, ensure_venv, venv_path
from experiments.runner import Deployment, Outcome, execute, run_dir
from experiments.suites import ALL_SUITES, PRESETS, RunPlan, plan
from experiments.summary import RunResult, run_result, write_outputs
from stellaris.rundir.outputs import fmt

console = Console(stderr=True)


def _deployment(stack: ExitStack, redis_url: str | None, gateway_url: str | None, token: str | None) -> Deployment:
    """The given deployment, or an embedded Redis and a local gateway shared by every run of the suite."""
    from stellaris.platform.local import Platform
    from stellaris.round.trainer import threads_env

    platform = stack.enter_context(
        Platform(redis_url=redis_url, gateway_url=gateway_url, gateway_token=token, instance_env=threads_env())
    )
    assert platform.cache is not None and platform.gateway_url is not None
    # the suite's runs are processes on this machine: the embedded server's socket file
    return Deployment(platform.cache.local_url, platform.gateway_url, platform.gateway_token)


def make_figures(
    suite: str, suite_dir: Path, root: Path, plans: list[RunPlan], results: list[RunResult], note: str
) -> list[Path]:
    groups = list(dict.fromkeys(p.group for p in plans))
    made: list[Path] = []
    if suite == "algorithms":
        for algo, fig in (("ppo", "Fig. 6"), ("impact", "Fig. 7")):
            if not any(g.startswith(f"{algo}/") for g in groups):
                continue
            made.append(
                figures.reward_figure(
                    suite_dir / f"algorithms_{algo}.png",
                    root,
                    plans,
                    [g for g in groups if g.startswith(f"{algo}/")],
                    ["vanilla", "stellaris"],
                    f"{algo.upper()}: vanilla vs Stellaris (cf. paper {fig})",
                    note,
                )
            )
    elif suite == "cost":
        made.append(figures.cost_figure(suite_dir / "cost.png", results, groups, note))
    elif suite == "ablation":
        made.append(figures.ablation_figure(suite_dir / "ablation.png", root, plans, note))
    elif suite == "sensitivity":
        made.append(figures.sensitivity_figure(suite_dir / "sensitivity.png", results, note))
    elif suite == "rllib":
        made.append(figures.rllib_figure(suite_dir / "rllib.png", root, plans, results, note))
    else:
        made.append(figures.breakdown_figure(suite_dir / "breakdown.png", results, groups, note))
    return made


def print_summary(suite: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"{suite}: final reward (mean ± std over seeds), cost, ratios vs baseline")
    columns = (
        "group",
        "variant",
        "seeds",
        "reward",
        "reward ½ run",
        "reward end",
        "to target s",
        "wall s",
        "cost $",
        "reward ratio",
        "cost ratio",
        "overhead",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("group", "variant") else "right")
    for r in rows:
        table.add_row(
            r["group"],
            r["variant"],
            str(r["seeds"]),
            f"{fmt(r['final_reward_mean'], '.1f')} ± {fmt(r['final_reward_std'], '.1f')}",
            f"{fmt(r['reward_half_mean'], '.0f')} ± {fmt(r['reward_half_std'], '.0f')}",
            f"{fmt(r['reward_end_mean'], '.0f')} ± {fmt(r['reward_end_std'], '.0f')}",
            fmt(r["time_to_target_s_mean"], ".0f"),
            fmt(r["wall_clock_s_mean"], ".0f"),
            fmt(r["cost_usd_mean"], ".4f"),
            fmt(r["reward_ratio"], ".2f"),
            fmt(r["cost_ratio"], ".2f"),
            fmt(100 * r["overhead_share_mean"], ".1f") + "%",
        )
    out = Console()
    if not out.is_terminal:  # logs keep the table's rows whole
        out = Console(width=160)
    out.print(table)


def suite_plans(
    suite: str, preset: str, seeds: int, variants: list[str] | None, *, first_seed: int, rllib_cores: int | None
) -> list[RunPlan]:
    """The suite's runs; raises ValueError naming a bad suite, preset, seeds or variant."""
    if suite == "rllib":
        cores = rllib_cores if rllib_cores is not None else len(os.sched_getaffinity(0))
        return rllib_suite.plans(preset, seeds, variants, cores=cores, first_seed=first_seed)
    return plan(suite, preset, seeds, variants, first_seed=first_seed)


def _check_limits(parallel: int, rllib_timeout_s: float) -> None:
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    if rllib_timeout_s <= 0:
        raise ValueError(f"rllib_timeout_s must be positive, got {rllib_timeout_s}")


def run_suite(
    suite: str,
    *,
    preset: str = "quick",
    seeds: int | None = None,
    first_seed: int = 0,
    out: Path = Path("results"),
    parallel: int = 2,
    redis_url: str | None = None,
    gateway_url: str | None = None,
    gateway_token: str | None = None,
    report_only: bool = False,
    variants: list[str] | None = None,
    target_reward: float | None = None,
    rllib_venv: Path | None = None,
    rllib_cores: int | None = None,
    rllib_timeout_s: float = rllib_suite.RUN_TIMEOUT_S,
) -> int:
    """Run (or resume) the suite, then write its CSVs and figures; returns the exit code. With `report_only`, only
    the CSVs and figures, from the runs already under `out`. The `rllib` suite gives RLlib `rllib_cores` cores (default:
    this machine's) and runs everything one at a time, so wall-clock and cost compare systems on the same cores."""
    budget = PRESETS.get(preset)
    n_seeds = seeds if seeds is not None else (budget.default_seeds if budget else 1)
    plans = suite_plans(suite, preset, n_seeds, variants, first_seed=first_seed, rllib_cores=rllib_cores)
    parallel = 1 if suite == "rllib" else parallel
    assert budget is not None
    _check_limits(parallel, rllib_timeout_s)
    note = f"preset {preset}: {budget.description}"
    ours = [p for p in plans if not rllib_suite.is_rllib(p)]
    theirs = [p for p in plans if rllib_suite.is_rllib(p)]
    unique = {p.run_id for p in plans}
    console.print(f"[bold]{suite}[/] suite, preset [bold]{preset}[/]: {budget.description}")
    console.print(f"{len(unique)} runs ({n_seeds} seeds from {first_seed}), {parallel} in parallel; output under {out}")
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    code = 0
    with ExitStack() as stack:
        progress = stack.enter_context(
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
        )
        task = progress.add_task(f"{suite} runs", total=len(unique))

        def on_outcome(o: Outcome) -> None:
            outcomes.append(o)
            progress.advance(task)
            if o.status != "skipped":
                style = {"done": "green", "failed": "red"}.get(o.status, "yellow")
                progress.console.print(
                    f"[{style}]{o.status}[/] {o.plan.run_id} ({o.seconds:.0f} s) {o.detail}", highlight=False
                )

        def echo(line: str) -> None:  # pip's and RLlib's lines as they are ("ray[rllib]" is no markup)
            progress.console.print(line, markup=False, highlight=False)

        try:
            if not report_only:
                # The RLlib venv first: a failed install stops the suite before any run is spent.
                unfinished = [p for p in theirs if not rllib_suite.is_finished(out, p)]
                python = ensure_venv(venv_path(rllib_venv), echo=echo) if unfinished else None
                if ours:
                    deployment = _deployment(stack, redis_url, gateway_url, gateway_token)
                    execute(out, ours, deployment, parallel=parallel, on_outcome=on_outcome)
                if python is not None:
                    rllib_suite.execute(
                        out, theirs, python, on_outcome=on_outcome, echo=echo, timeout_s=rllib_timeout_s
                    )
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted[/]: finished runs are kept; run the same command to resume ({out})")
            code = 130
    failed = _report(suite, out, plans, outcomes, note, target_reward=target_reward, seconds=time.monotonic() - t0)
    return code or (1 if failed else 0)


def _report(
    suite: str,
    out: Path,
    plans: list[RunPlan],
    outcomes: list[Outcome],
    note: str,
    *,
    target_reward: float | None,
    seconds: float,
) -> list[Outcome]:
    """The suite's CSVs, figures and summary table from the runs under `out`, and a line on this invocation's
    `outcomes`; returns the failed ones."""
    failed = [o for o in outcomes if o.status == "failed"]
    results = [r for p in plans if (r := run_result(p, run_dir(out, p), target_reward=target_reward)) is not None]
    suite_dir = out / suite
    rows = write_outputs(suite_dir, suite, results)
    made = make_figures(suite, suite_dir, out, plans, results, note) if results else []
    print_summary(suite, rows)
    console.print(
        f"{sum(o.status == 'done' for o in outcomes)} runs done, {sum(o.status == 'skipped' for o in outcomes)} "
        f"already finished, {len(failed)} failed in {seconds:.0f} s; "
        f"wrote {suite_dir / 'summary.csv'}, {suite_dir / 'runs.csv'}" + "".join(f", {p}" for p in made)
    )
    for o in failed:
        console.print(f"[red]failed[/] {o.plan.run_id}: {o.detail} (log: {run_dir(out, o.plan) / 'log.txt'})")
    return failed


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops a suite as Ctrl-C does: runs checkpoint, the summary is written, the same command resumes."""
    raise KeyboardInterrupt


app = typer.Typer(add_completion=False)


@app.command()
def main(
    suite: str = typer.Argument(..., help=f"one of: {', '.join(ALL_SUITES)}"),
    preset: str = typer.Option(
        "quick", help="quick (≤15 min per suite on 2 cores), paper (50 rounds, Table III) or long (500k steps)"
    ),
    seeds: int | None = typer.Option(None, help="seeds per configuration (default: quick 2, paper 10)"),
    first_seed: int = typer.Option(0, help="the first seed: runs use first-seed, first-seed + 1, ..."),
    out: Path = typer.Option(Path("results"), help="output root; suites under one root share identical runs"),
    parallel: int = typer.Option(2, help="training runs at a time"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="use this Redis instead of an embedded one"),
    gateway_url: str | None = typer.Option(None, "--gateway-url", help="use this gateway instead of a local one"),
    gateway_token: str | None = typer.Option(None, "--gateway-token", envvar="STELLARIS_GATEWAY_TOKEN"),
    report_only: bool = typer.Option(False, "--report-only", help="only write CSVs and figures from runs under DIR"),
    variants: str | None = typer.Option(None, help="comma-separated rows of the suite to run (default: all)"),
    target_reward: float | None = typer.Option(None, help="also report the wall-clock to this reward"),
    rllib_venv: Path | None = typer.Option(
        None, "--rllib-venv", envvar=VENV_ENV_VAR, help="rllib suite: RLlib's venv, made if missing (.venv-rllib)"
    ),
    rllib_cores: int | None = typer.Option(None, help="rllib suite: cores given to RLlib (default: this machine's)"),
    rllib_timeout_s: float = typer.Option(rllib_suite.RUN_TIMEOUT_S, help="rllib suite: limit per RLlib run (s)"),
) -> None:
    """Run one suite of the paper's evaluation and write its summary.csv and figures."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = run_suite(
            suite,
            preset=preset,
            seeds=seeds,
            first_seed=first_seed,
            out=out,
            parallel=parallel,
            redis_url=redis_url,
            gateway_url=gateway_url,
            gateway_token=gateway_token,
            report_only=report_only,
            variants=None if variants is None else [v.strip() for v in variants.split(",") if v.strip()],
            target_reward=target_reward,
            rllib_venv=rllib_venv,
            rllib_cores=rllib_cores,
            rllib_timeout_s=rllib_timeout_s,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except RLlibEnvError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
