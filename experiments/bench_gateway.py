"""Gateway overhead: warm no-op invocations through the gateway vs straight to the same instance, in one run.

Starts a real gateway (`python -m gateway`, process backend) on the embedded Redis, registers a no-op function
with one warm instance, then drives both paths with an aiohttp load generator at concurrency 1 and 32,
alternating paths over `--repeats` windows. Reports p50/p99 latency, invocations/s, and gateway - direct.

    python -m experiments.bench_gateway [--seconds 2] [--repeats 3]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import typer
from rich.console import Console
from rich.table import Table

from cache import connect
from gateway.client import GatewayClient
from gateway.models import FunctionSpec

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"


@dataclass
class Window:
    latencies_s: list[float]
    elapsed_s: float

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.elapsed_s


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(url: str, headers: dict[str, str], concurrency: int, seconds: float) -> Window:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for _ in range(20):  # warm the connections
            async with session.post(url, json={}) as resp:
                await resp.read()
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                async with session.post(url, json={}) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url}: HTTP {resp.status}")
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Window(latencies, time.perf_counter() - start)


def start_gateway(redis_url: str) -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "STELLARIS_GATEWAY_PORT": "0",
        "STELLARIS_GATEWAY_TOKEN": TOKEN,
        "STELLARIS_LOG_LEVEL": "WARNING",
        "STELLARIS_GATEWAY_TARGET_PREFIXES": '["functions.handlers.", "experiments."]',  # the no-op handler
    }
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"gateway did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


Stats = dict[str, tuple[float, float, float]]  # path -> (p50 ms, p99 ms, invocations/s)


def measure(seconds: float, repeats: int, console: Console) -> list[tuple[int, Stats]]:
    """Per concurrency (1, 32): medians of the timed windows for the direct and the gateway path."""
    with connect() as cache:
        proc, gw_url = start_gateway(cache.url)
        try:
            with GatewayClient(gw_url, token=TOKEN) as client:
                spec = FunctionSpec(
                    name="noop",
                    target="experiments.noop:handle",
                    min_warm=1,
                    max_instances=1,
                    concurrency_per_instance=64,
                    max_concurrency=64,
                    env={"STELLARIS_LOG_LEVEL": "WARNING"},
                )
                client.register(spec)
                instance_url = client.function("noop")["status"]["instances"][0]["url"]
            paths = {
                "direct": (f"{instance_url}/invoke", {}),
                "gateway": (f"{gw_url}/function/noop", {"Authorization": f"Bearer {TOKEN}"}),
            }
            rows = []
            for conc in (1, 32):
                windows: dict[str, list[Window]] = {p: [] for p in paths}
                for rep in range(repeats):
                    for name, (url, headers) in paths.items():
                        console.log(f"concurrency {conc}, {name}, window {rep + 1}/{repeats}")
                        windows[name].append(asyncio.run(drive(url, headers, conc, seconds)))
                stats = {
                    name: (
                        statistics.median(pct(w.latencies_s, 0.5) for w in ws) * 1000,
                        statistics.median(pct(w.latencies_s, 0.99) for w in ws) * 1000,
                        statistics.median(w.rate for w in ws),
                    )
                    for name, ws in windows.items()
                }
                rows.append((conc, stats))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def main(
    seconds: float = typer.Option(2.0, help="length of one timed window"),
    repeats: int = typer.Option(3, help="windows per path and concurrency; medians are reported"),
) -> None:
    console = Console()
    rows = measure(seconds, repeats, console)
    table = Table(title="Warm no-op invocations: gateway vs direct to the same instance (medians, one run)")
    for col in (
        "concurrency",
        "path",
        "p50 ms",
        "p99 ms",
        "invocations/s",
        "extra p50 ms",
        "extra p99 ms",
        "rate ratio",
    ):
        table.add_column(col, justify="right")
    for conc, stats in rows:
        d50, d99, drate = stats["direct"]
        for name, (p50, p99, rate) in stats.items():
            extra = name == "gateway"
            table.add_row(
                str(conc),
                name,
                f"{p50:.2f}",
                f"{p99:.2f}",
                f"{rate:,.0f}",
                f"{p50 - d50:+.2f}" if extra else "",
                f"{p99 - d99:+.2f}" if extra else "",
                f"{rate / drate:.2f}x" if extra else "",
            )
    console.print(table)
    console.print("Targets: <= 1 ms extra at p50, <= 5 ms extra at p99, >= 2,000 invocations/s through the gateway.")


if __name__ == "__main__":
    typer.run(main)
