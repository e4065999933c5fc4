"""The `stellaris` command line."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import typer

app = typer.Typer(help="Stellaris: serverless asynchronous-learner deep RL.", no_args_is_help=True)


def _sigterm_as_exit() -> None:
    """Turn SIGTERM into SystemExit so context managers stop servers and instances on `kill` as on Ctrl-C."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


DEBUG_ENV = "STELLARIS_DEBUG"  # set (not 0): a failure shows its traceback
EXIT_GRACE_ENV = "STELLARIS_EXIT_GRACE_S"
EXIT_GRACE_S = 5.0  # default: how long calls still running at exit are waited for before they are left behind
MAX_EXIT_GRACE_S = 3600.0


def exit_grace_s() -> float:
    """$STELLARIS_EXIT_GRACE_S, default EXIT_GRACE_S: checked when `train` starts, so a bad value stops it then."""
    from stellaris.platform.env_limits import seconds_from_env

    return seconds_from_env(EXIT_GRACE_ENV, EXIT_GRACE_S, 0.0, MAX_EXIT_GRACE_S)


def _exit_with(command: Callable[[], int]) -> NoReturn:
    """Run a command's body and exit with its code. A failure prints one line naming what went wrong (the errors a
    user can cause carry that line as their message) and exits non-zero, without a traceback unless STELLARIS_DEBUG
    is set: configuration errors exit 2, the rest 1."""
    from cache import CacheError, RedisServerDied
    from gateway.client import GatewayError
    from stellaris.config import ConfigError
    from stellaris.evaluate import EvalError
    from stellaris.platform.cache_faults import CacheFull
    from stellaris.platform.gateway_watch import GatewayStuck
    from stellaris.platform.local import PlatformError
    from stellaris.rundir.outputs import RunDirError

    try:
        code = command()
    except (click.exceptions.Exit, click.ClickException, click.Abort):
        raise
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        named = (
            CacheError,
            CacheFull,
            RedisServerDied,
            GatewayError,
            GatewayStuck,
            ConfigError,
            RunDirError,
            PlatformError,
            EvalError,
        )
        notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))  # what to do next, e.g. resume
        if isinstance(exc, named):
            typer.echo(f"error: {exc}{notes}", err=True)
        else:  # not one we foresaw: its type helps, and the traceback is one variable away
            typer.echo(f"error: {type(exc).__name__}: {exc}{notes}\n(set {DEBUG_ENV}=1 to see the traceback)", err=True)
        _leave(2 if isinstance(exc, (ConfigError, RunDirError, EvalError)) else 1)
    _leave(code)


def _leave(code: int) -> NoReturn:
    """Exit with `code`, leaving behind any call still blocked on a gateway that answers nothing (after Ctrl-C, or an
    error): the interpreter's exit would wait for it, up to the call's hour, however often Ctrl-C is pressed."""
    rounds = sys.modules.get("stellaris.round.protocol")  # no Rounds ever made: no call threads
    try:
        grace_s = exit_grace_s()
    except ValueError:  # said when train started; a library caller that set it badly gets the default
        grace_s = EXIT_GRACE_S
    stuck = rounds.stuck_calls(grace_s) if rounds is not None else []
    if stuck:
        typer.echo(f"leaving {len(stuck)} call(s) that still wait on a gateway that answers nothing", err=True)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code) from None


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as dist_version

    typer.echo(dist_version("stellaris"))


@app.command()
def redis() -> None:
    """Run a private embedded redis-server in the foreground and print its REDIS_URL (Ctrl-C stops it)."""
    from cache.server import EmbeddedRedis

    _sigterm_as_exit()
    with EmbeddedRedis() as server:
        typer.echo(f"REDIS_URL={server.url}")
        typer.echo(f"redis-server pid {server.pid}; Ctrl-C to stop")
        threading.Event().wait()


@app.command()
def demo(
    minutes: float = typer.Option(3.0, help="training budget"),
    env: str = typer.Option("Hopper-v5", help="Gymnasium env id"),
) -> None:
    """The main job on the embedded default: a short Stellaris training run, then an evaluation of its policy."""
    from stellaris.config import TrainConfig
    from stellaris.evaluate import evaluate_run
    from stellaris.run import run_training

    _sigterm_as_exit()

    def body() -> int:
        cfg = TrainConfig(env=env, preset="fast", mode="stellaris", max_minutes=minutes)
        code = run_training(cfg)
        if code == 0 and cfg.out is not None:
            returns = evaluate_run(cfg.out, episodes=3, seed=12345)
            typer.echo(f"evaluation of {cfg.out}/policy.safetensors: mean return {sum(returns) / len(returns):.1f}")
        return code

    _exit_with(body)


def _train(**given: Any) -> None:
    """Train with the Stellaris workflow through the gateway and the cache. Each option is a field of the --config
    YAML file, and a flag given beats the file (a knob's `overrides.stellaris` entry there included); `--set` beats
    the file's `overrides:` entry."""
    from stellaris.config import ConfigError, load_config
    from stellaris.run import run_training
    from stellaris.train_options import field_values, parsed_sets

    _sigterm_as_exit()
    config, resume, sets = given.pop("config"), given.pop("resume"), given.pop("sets")
    try:
        from stellaris.platform.local import gateway_start_attempts, given_gateway_wait_s

        exit_grace_s()
        given_gateway_wait_s()
        gateway_start_attempts()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        flags, nested = field_values(given), parsed_sets(sets or [])
        if resume is not None:
            cfg = load_config(resume / "config.yaml", flags, section="config", sets=nested)
            cfg.out = resume
        else:
            cfg = load_config(config, flags, sets=nested)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    _exit_with(lambda: run_training(cfg, resume=resume is not None))


def _register_train() -> None:
    """`train`, its options built from TrainConfig's fields (stellaris/train_options.py)."""
    from stellaris.train_options import with_train_signature

    app.command("train")(with_train_signature(_train))


_register_train()


@app.command("eval")
def evaluate(
    run_dir: Path = typer.Argument(..., help="a run directory with policy.safetensors"),
    episodes: int = typer.Option(10, min=1),
    seed: int | None = typer.Option(
        None, help="the eval env's seed (default: the run's evaluation seed, seed + 1000003)"
    ),
) -> None:
    """Run the run's final policy for N episodes (deterministic actions) and print the mean return."""
    from stellaris.evaluate import evaluate_run

    def body() -> int:
        returns = evaluate_run(run_dir, episodes=episodes, seed=seed)
        typer.echo(f"mean return {sum(returns) / len(returns):.2f} over {len(returns)} episodes")
        return 0

    _exit_with(body)


def _described(name: str) -> str:
    """A `plan` option's help: the declaration's description and default (TrainConfig's field, or the latency
    model's), so that it says what `train` and docs/scale-model.md say."""
    from stellaris.config import TrainConfig
    from stellaris.plan.latency import LatencyModel

    fields = {**TrainConfig.model_fields, **LatencyModel.model_fields}
    info = fields[name]
    default = getattr(info.default, "value", info.default)
    return f"{info.description} (default {default})"


@app.command("plan")
def plan(
    env: str | None = typer.Option(None, help=_described("env")),
    algo: str | None = typer.Option(None, help=_described("algo")),
    preset: str | None = typer.Option(None, help=_described("preset")),
    mode: str | None = typer.Option(None, help=_described("mode")),
    learners: list[str] | None = typer.Option(
        None,
        "--learners",
        metavar="N[,N...]",
        help="learner counts to model: a comma list or repeated (default 1,2,4,8,16)",
    ),
    seed: int | None = typer.Option(None, help="seed of envs, action sampling, minibatches, init and latency draws"),
    rounds: int | None = typer.Option(None, help="rounds to model: the run's planned rounds, as train's --rounds"),
    total_steps: int | None = typer.Option(None, help="env steps to model, in whole rounds, as train's"),
    d: float | None = typer.Option(None, help=_described("d")),
    v: float | None = typer.Option(None, help=_described("v")),
    rho: float | None = typer.Option(None, help=_described("rho")),
    actors: int | None = typer.Option(None, help=_described("actors")),
    envs_per_actor: int | None = typer.Option(None, help=_described("envs_per_actor")),
    actor_kind: str | None = typer.Option(None, help=_described("actor_kind")),
    billing: str | None = typer.Option(None, help=_described("billing")),
    sets: list[str] | None = typer.Option(
        None, "--set", metavar="KEY=VALUE", help="an algorithm field over the preset, as train's --set (repeatable)"
    ),
    cold_start_s: float | None = typer.Option(None, help=_described("cold_start_s")),
    cold_start_p: float | None = typer.Option(None, help=_described("cold_start_p")),
    straggler_p: float | None = typer.Option(None, help=_described("straggler_p")),
    straggler_factor: float | None = typer.Option(None, help=_described("straggler_factor")),
    jitter_sigma: float | None = typer.Option(None, help=_described("jitter_sigma")),
    speed_spread: float | None = typer.Option(None, help=_described("speed_spread")),
    task_overhead_s: float | None = typer.Option(None, help=_described("task_overhead_s")),
    apply_overhead_s: float | None = typer.Option(None, help=_described("apply_overhead_s")),
    apply_per_gradient_s: float | None = typer.Option(None, help=_described("apply_per_gradient_s")),
    prewarm: bool | None = typer.Option(None, "--prewarm/--no-prewarm", help=_described("prewarm")),
    task_s: float | None = typer.Option(None, help="model every task as this many seconds (default: as measured)"),
    apply_s: float | None = typer.Option(
        None, help="model every apply (update and publish) as this many seconds (default: as measured)"
    ),
    collect_s: float | None = typer.Option(
        None, help="model every batch's collection as this many seconds (default: as measured)"
    ),
    eval_episodes: int = typer.Option(3, help="deterministic evaluation episodes after the last round (0: none)"),
    eval_every: int = typer.Option(0, help="also evaluate every this many rounds (0: after the last round only)"),
    compare: Path | None = typer.Option(
        None, "--compare", help="a real run directory: model its job, N and rounds, and compare them round by round"
    ),
    calibrate: list[Path] = typer.Option(
        [],
        "--calibrate",
        help="a real one-learner run directory of the same job (repeat to pool several): take the task's compute and "
        "overhead, the apply, the collection and the tasks' jitter it measured (flags given win)",
    ),
    jitter_from: list[Path] = typer.Option(
        [],
        "--jitter-from",
        help="a real one-learner run directory of the same job under another rule than sync (repeat to pool): take "
        "the tasks' jitter from its gradients' arrivals, as a sync plan needs (a sync run's arrivals hold its applies)",
    ),
    out: Path = typer.Option(Path("plan"), "--out", help="directory for the CSVs"),
) -> None:
    """Model how d, v, ρ and N would behave on a cluster of N learners before paying for it: every gradient computed
    for real on real episodes, its arrival on a virtual clock from a latency model. Prints a table of the N and writes
    a CSV per N (docs/scale-model.md)."""
    from stellaris.plan.command import PlanRequest

    train = {
        "env": env,
        "algo": algo,
        "preset": preset,
        "mode": mode,
        "seed": seed,
        "rounds": rounds,
        "total_steps": total_steps,
        "d": d,
        "v": v,
        "rho": rho,
        "actors": actors,
        "envs_per_actor": envs_per_actor,
        "actor_kind": actor_kind,
        "billing": billing,
    }
    latency = {
        "cold_start_s": cold_start_s,
        "cold_start_p": cold_start_p,
        "straggler_p": straggler_p,
        "straggler_factor": straggler_factor,
        "jitter_sigma": jitter_sigma,
        "speed_spread": speed_spread,
        "task_overhead_s": task_overhead_s,
        "apply_overhead_s": apply_overhead_s,
        "apply_per_gradient_s": apply_per_gradient_s,
        "prewarm": prewarm,
    }
    request = PlanRequest(
        train={k: x for k, x in train.items() if x is not None},
        sets=sets or [],
        learners=learners or [],
        latency={k: x for k, x in latency.items() if x is not None},
        eval_episodes=eval_episodes,
        eval_every=eval_every,
        task_s=task_s,
        collect_s=collect_s,
        apply_s=apply_s,
        compare=compare,
        calibrate=calibrate,
        jitter_from=jitter_from,
        out=out,
    )

    def body() -> int:
        from rich.console import Console

        from stellaris.plan.command import plan as checked
        from stellaris.plan.command import run

        planned = checked(request)  # every input, before torch loads
        import torch

        torch.set_num_threads(1)  # one thread, as each function instance computes (TrainConfig.torch_threads)
        return run(planned, request.out, Console())

    _exit_with(body)


@app.command("plot")
def plot(
    runs: list[Path] = typer.Argument(..., help="run directories; same config but seed: one line, mean ± std"),
    out: Path = typer.Option(Path("curves.png"), "--out", help="PNG file to write"),
) -> None:
    """Overlay runs' learning curves (training return vs env steps and vs wall-clock)."""
    from stellaris.plots import PlotError, plot_runs

    try:
        typer.echo(f"wrote {plot_runs(runs, out)}")
    except PlotError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def main() -> None:
    """The `stellaris` command: the app, then a quick exit (`host.lifetime.quick_exit`), so that a finished job
    does not wait on the interpreter's teardown. An error that escapes the app leaves the usual way."""
    import faulthandler

    from host.lifetime import quick_exit

    faulthandler.enable()  # a crash in native code (a signal such as SIGSEGV) prints every thread's stack to stderr
    code = 0
    try:
        app()  # click's standalone mode ends in SystemExit
    except SystemExit as done:
        if isinstance(done.code, str):
            typer.echo(done.code, err=True)
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    quick_exit(code)


if __name__ == "__main__":
    main()
