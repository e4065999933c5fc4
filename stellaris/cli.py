"""The `stellaris` command line."""

from __future__ import annotations

import signal
import threading

import typer

app = typer.Typer(help="Stellaris: serverless asynchronous-learner deep RL.", no_args_is_help=True)


def _sigterm_as_exit() -> None:
    """Turn SIGTERM into SystemExit so context managers stop servers and instances on `kill` as on Ctrl-C."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


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
def demo() -> None:
    """The main job on the embedded default. (Until the training job lands: the cache benchmark.)"""
    _sigterm_as_exit()
    bench_cache(seconds=0.5, repeats=3)
