"""The `stellaris` command line."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import typer

from cache.contract.knobs import knob_info, train_name

app = typer.Typer(help="Stellaris: serverless asynchronous-learner deep RL.", no_args_is_help=True)


def _sigterm_as_exit() -> None:
    """Turn SIGTERM into SystemExit so context managers stop servers and instances on `kill` as on Ctrl-C."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


DEBUG_ENV = "STELLARIS_DEBUG"  # set (not 0): a failure shows its traceback


def _exit_with(command: Callable[[], int]) -> NoReturn:
    """Run a command's body and exit with its code. A failure prints one line naming what went wrong (the errors a
    user can cause carry that line as their message) and exits non-zero, without a traceback unless STELLARIS_DEBUG
    is set: configuration errors exit 2, the rest 1."""
    from cache import CacheError, RedisServerDied
    from gateway.client import GatewayError
    from stellaris.config import ConfigError
    from stellaris.control.outputs import RunDirError
    from stellaris.control.platform import PlatformError
    from stellaris.evaluate import EvalError

    try:
        code = command()
    except (click.exceptions.Exit, click.ClickException, click.Abort):
        raise
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        named = (CacheError, RedisServerDied, GatewayError, ConfigError, RunDirError, PlatformError, EvalError)
        if isinstance(exc, named):
            typer.echo(f"error: {exc}", err=True)
        else:  # not one we foresaw: its type helps, and the traceback is one variable away
            typer.echo(f"error: {type(exc).__name__}: {exc}\n(set {DEBUG_ENV}=1 to see the traceback)", err=True)
        raise typer.Exit(2 if isinstance(exc, (ConfigError, RunDirError, EvalError)) else 1) from None
    raise typer.Exit(code)


def _knob_option(name: str) -> Any:
    """The `train` flag of a Stellaris knob, from its one declaration (cache/contract/knobs.py): its help and
    default come from there, and it is None unless given, so that the YAML file or the declared default applies
    (pydantic checks the bounds, in TrainConfig, and names the field)."""
    info = knob_info(name)
    flag = "--" + train_name(name).replace("_", "-")
    decls = [f"{flag}/--no-{flag[2:]}"] if isinstance(info.default, bool) else [flag]
    return typer.Option(None, *decls, help=f"{info.description} (default {info.default})", show_default=False)


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


@app.command("bench-cache")
def bench_cache(
    seconds: float = typer.Option(1.0, help="length of one timed window"),
    repeats: int = typer.Option(5, help="timed windows per path; the median is reported"),
) -> None:
    """Cache throughput: our codec and streams vs pickle + Redis vs raw bytes."""
    from experiments.bench_cache import main as bench_main

    _sigterm_as_exit()
    bench_main(seconds=seconds, repeats=repeats, csv_path=None)


@app.command()
def demo(
    minutes: float = typer.Option(3.0, help="training budget"),
    env: str = typer.Option("Hopper-v5", help="Gymnasium env id"),
) -> None:
    """The main job on the embedded default: a short Stellaris training run, then an evaluation of its policy."""
    from stellaris.config import TrainConfig
    from stellaris.control.run import run_training
    from stellaris.evaluate import evaluate_run

    _sigterm_as_exit()

    def body() -> int:
        cfg = TrainConfig(env=env, preset="fast", mode="stellaris", max_minutes=minutes)
        code = run_training(cfg)
        if code == 0 and cfg.out is not None:
            returns = evaluate_run(cfg.out, episodes=3, seed=12345)
            typer.echo(f"evaluation of {cfg.out}/policy.safetensors: mean return {sum(returns) / len(returns):.1f}")
        return code

    _exit_with(body)


@app.command()
def train(
    config: Path | None = typer.Option(None, "--config", help="YAML file with TrainConfig fields"),
    env: str | None = typer.Option(None, help="Gymnasium env id, e.g. Hopper-v5, or module:EnvClass"),
    env_module: str | None = typer.Option(None, "--env-module", help="module imported first (it registers env ids)"),
    env_kwargs: str | None = typer.Option(None, "--env-kwargs", help='gymnasium.make kwargs as JSON, e.g. {"size": 3}'),
    algo: str | None = typer.Option(None, help="ppo, impact or appo"),
    preset: str | None = typer.Option(None, help="paper or fast (SPEC §4)"),
    mode: str | None = _knob_option("rule"),
    rounds: int | None = typer.Option(None),
    total_steps: int | None = typer.Option(None, "--total-steps"),
    max_minutes: float | None = typer.Option(None, "--max-minutes"),
    actors: int | None = typer.Option(None),
    actor_kind: str | None = typer.Option(None, "--actor-kind", help="serverful or serverless"),
    envs_per_actor: int | None = typer.Option(None, "--envs-per-actor"),
    learners: int | None = typer.Option(None, help="learner capacity: max concurrent learner functions"),
    d: float | None = _knob_option("d"),
    v: float | None = _knob_option("v"),
    rho: float | None = _knob_option("rho"),
    truncation: bool | None = _knob_option("truncation"),
    softsync_k: int | None = _knob_option("softsync_k"),
    ssp_bound: int | None = _knob_option("ssp_bound"),
    billing: str | None = typer.Option(None, help="serverless (metered invocations) or serverful (held resources)"),
    seed: int | None = typer.Option(None),
    out: Path | None = typer.Option(None, help="run directory"),
    redis_url: str | None = typer.Option(None, "--redis-url", envvar="REDIS_URL"),
    gateway_url: str | None = typer.Option(None, "--gateway-url", envvar="STELLARIS_GATEWAY_URL"),
    gateway_token: str | None = typer.Option(None, "--gateway-token", envvar="STELLARIS_GATEWAY_TOKEN"),
    resume: Path | None = typer.Option(None, help="continue the run in this directory"),
    backend: str | None = typer.Option(
        None, help="process (beside the gateway, the default), docker (containers) or ray (actors on a Ray cluster)"
    ),
    image: str | None = typer.Option(None, help="docker: the image of every role without its own flag"),
    learner_image: str | None = typer.Option(None, "--learner-image", help="docker: the learners' image"),
    parameter_image: str | None = typer.Option(None, "--parameter-image", help="docker: the parameter image"),
    actor_image: str | None = typer.Option(None, "--actor-image", help="docker: the serverless actors' image"),
    learner_gpus: float | None = typer.Option(
        None, "--learner-gpus", help="docker: GPUs per learner (default 0); ray: fractions too (0.25: 4 per GPU)"
    ),
    parameter_gpus: float | None = typer.Option(None, "--parameter-gpus", help="docker/ray: the parameter's GPUs"),
    device: str | None = typer.Option(None, help="auto, cpu or cuda: the learners' and parameter function's device"),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="ray: the cluster to join (host:port or auto); default a private local Ray"
    ),
    learner_resources: str | None = typer.Option(
        None, "--learner-resources", help="ray: custom resources per learner, e.g. gpu_node=0.01 (comma-separated)"
    ),
    parameter_resources: str | None = typer.Option(None, "--parameter-resources", help="ray: the parameter's"),
    actor_resources: str | None = typer.Option(None, "--actor-resources", help="ray: serverless actors' resources"),
) -> None:
    """Train with the Stellaris workflow through the gateway and the cache. A flag given beats the --config file,
    a knob's `overrides.stellaris` entry there included."""
    from stellaris.config import ConfigError, load_config
    from stellaris.control.run import run_training

    _sigterm_as_exit()
    flags = {
        "env": env, "algo": algo, "preset": preset, "mode": mode, "rounds": rounds, "total_steps": total_steps,
        "max_minutes": max_minutes, "actors": actors, "actor_kind": actor_kind, "envs_per_actor": envs_per_actor,
        "learners": learners, "d": d, "v": v, "rho": rho, "truncation": truncation, "softsync_k": softsync_k,
        "ssp_bound": ssp_bound, "billing": billing, "seed": seed, "out": out, "redis_url": redis_url,
        "gateway_url": gateway_url, "gateway_token": gateway_token, "backend": backend, "image": image,
        "learner_image": learner_image, "parameter_image": parameter_image, "actor_image": actor_image,
        "env_module": env_module, "env_kwargs": env_kwargs,
        "learner_gpus": learner_gpus, "parameter_gpus": parameter_gpus, "device": device, "ray_address": ray_address,
    }  # fmt: skip
    try:
        for role, given in (("learner", learner_resources), ("parameter", parameter_resources),
                            ("actor", actor_resources)):  # fmt: skip
            flags[f"{role}_resources"] = None if given is None else _resources(f"--{role}-resources", given)
        if resume is not None:
            cfg = load_config(resume / "config.yaml", flags, section="config")
            cfg.out = resume
        else:
            cfg = load_config(config, flags)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    _exit_with(lambda: run_training(cfg, resume=resume is not None))


def _resources(flag: str, text: str) -> dict[str, float]:
    """`name=amount[,name=amount]` as a mapping; raises ConfigError naming the flag and the bad part."""
    from stellaris.config import ConfigError

    resources: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, amount = part.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError as exc:  # no '=' leaves amount empty: an error too
            raise ConfigError(f"{flag}: {part!r} is not name=amount (e.g. gpu_node=0.01)") from exc
    return resources


@app.command()
def experiment(
    suite: str = typer.Argument(
        ..., help="algorithms, cost, ablation, sensitivity, breakdown, or rllib (RLlib PPO vs Stellaris, own venv)"
    ),
    preset: str = typer.Option("quick", help="quick (≤15 min per suite on 2 cores) or paper (50 rounds, Table III)"),
    seeds: int | None = typer.Option(None, help="seeds per configuration (default: quick 2, paper 10)"),
    out: Path = typer.Option(Path("results"), help="output root; suites under one root share identical runs"),
    parallel: int = typer.Option(2, help="training runs at a time"),
) -> None:
    """Run a suite of the paper's evaluation (same as `python -m experiments.run`)."""
    from experiments.rllib_env import RLlibEnvError
    from experiments.run import run_suite

    _sigterm_as_exit()
    try:
        code = run_suite(suite, preset=preset, seeds=seeds, out=out, parallel=parallel)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except RLlibEnvError as exc:  # RLlib's own venv could not be made (the rllib suite)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    raise typer.Exit(code)


@app.command("eval")
def evaluate(
    run_dir: Path = typer.Argument(..., help="a run directory with policy.safetensors"),
    episodes: int = typer.Option(10, min=1),
    seed: int = typer.Option(12345),
) -> None:
    """Run the run's final policy for N episodes (deterministic actions) and print the mean return."""
    from stellaris.evaluate import evaluate_run

    def body() -> int:
        returns = evaluate_run(run_dir, episodes=episodes, seed=seed)
        typer.echo(f"mean return {sum(returns) / len(returns):.2f} over {len(returns)} episodes")
        return 0

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


if __name__ == "__main__":
    app()
