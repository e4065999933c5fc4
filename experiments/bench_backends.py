"""Ray backend vs process backend, side by side in one run: cold start and warm calls through a real gateway.

Starts one gateway (`python -m gateway`, no Ray address: it starts its private local Ray once, on the first ray
function, before anything is timed) on the embedded Redis. Then, alternating process and ray (A B A B ...) for
`--repeats` rounds, each round registers a fresh no-op function on that backend and measures:

- cold start: register + the first call (wall clock, as a caller sees it), and the instance's start to READY
  (the activation's init_s: for ray, creating the actor, placing it and starting its runtime);
- warm calls: `--calls` sequential calls through the gateway, p50 and p99.

Reports the median with min-max over the rounds per backend, and ray / process.

    python -m experiments.bench_backends [--repeats 3] [--calls 200]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cache import connect
from experiments.bench_gateway import TOKEN, pct, start_gateway
from gateway.client import GatewayClient
from gateway.models import FunctionSpec

BACKENDS = ("process", "ray")
QUIET = {"STELLARIS_LOG_LEVEL": "WARNING"}


@dataclass
class Rounds:
    """What each round measured for one backend (seconds)."""

    register_first_call_s: list[float] = field(default_factory=list)
    init_s: list[float] = field(default_factory=list)
    warm_p50_s: list[float] = field(default_factory=list)
    warm_p99_s: list[float] = field(default_factory=list)


def noop(name: str, backend: str) -> FunctionSpec:
    return FunctionSpec(name=name, backend=backend, target="experiments.noop:handle", env=QUIET)


def one_round(client: GatewayClient, backend: str, rnd: int, calls: int, into: Rounds) -> None:
    name = f"noop-{backend}-{rnd}"
    started = time.perf_counter()
    client.register(noop(name, backend))
    _, meter = client.invoke_metered(name, {})
    into.register_first_call_s.append(time.perf_counter() - started)
    if not meter.cold or meter.init_s is None:
        raise RuntimeError(f"the first call of {name} was not a cold start: {meter}")
    into.init_s.append(meter.init_s)
    latencies = []
    for _ in range(calls):
        t0 = time.perf_counter()
        client.invoke(name, {})
        latencies.append(time.perf_counter() - t0)
    into.warm_p50_s.append(pct(latencies, 0.5))
    into.warm_p99_s.append(pct(latencies, 0.99))
    client.delete(name)


def measure(repeats: int, calls: int, console: Console) -> tuple[dict[str, Rounds], float]:
    """Per backend, every round's figures; and how long the private Ray took to come up (not in any round)."""
    rounds = {backend: Rounds() for backend in BACKENDS}
    with connect() as cache:
        proc, url = start_gateway(cache.url)
        try:
            with GatewayClient(url, token=TOKEN) as client:
                console.log("starting the gateway's private Ray (untimed in the rounds)")
                started = time.perf_counter()
                client.register(noop("ray-warmup", "ray"))
                client.invoke("ray-warmup", {})
                client.delete("ray-warmup")
                ray_up_s = time.perf_counter() - started
                for rnd in range(repeats):
                    for backend in BACKENDS:
                        console.log(f"round {rnd + 1}/{repeats}: {backend}")
                        one_round(client, backend, rnd, calls, rounds[backend])
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return rounds, ray_up_s


def spread(values: list[float], scale: float, digits: int) -> str:
    """`median [min-max]`, scaled."""
    median, low, high = (v * scale for v in (statistics.median(values), min(values), max(values)))
    return escape(f"{median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]")


def main(
    repeats: int = typer.Option(3, help="rounds per backend, alternating process and ray"),
    calls: int = typer.Option(200, help="warm calls per round"),
) -> None:
    console = Console(width=max(100, Console().width))
    rounds, ray_up_s = measure(repeats, calls, console)
    title = f"Ray vs process backend through one gateway: median [min-max] over {repeats} rounds"
    table = Table(title=escape(title))
    for col in ("metric", "process", "ray", "ray / process"):
        table.add_column(col, justify="right")
    rows = (
        ("cold: register + 1st call, s", "register_first_call_s", 1.0, 3),
        ("cold: start to READY, s", "init_s", 1.0, 3),
        ("warm call p50, ms", "warm_p50_s", 1e3, 2),
        ("warm call p99, ms", "warm_p99_s", 1e3, 2),
    )
    for label, attr, scale, digits in rows:
        process, ray = getattr(rounds["process"], attr), getattr(rounds["ray"], attr)
        ratio = statistics.median(ray) / statistics.median(process)
        table.add_row(label, spread(process, scale, digits), spread(ray, scale, digits), f"{ratio:.2f}x")
    console.print(table)
    console.print(
        f"Warm calls: {calls} sequential per round. The gateway's private Ray came up in {ray_up_s:.1f} s, once."
    )


if __name__ == "__main__":
    typer.run(main)
