"""Redis round trips with the client and the server on one core against on two: what a wake-up across cores costs.

Every synchronous call to Redis wakes the server and then the caller. On this project's machines (2 vCPUs of a
virtual machine) a wake-up on the other core costs several times one on the same core, and a round's learner claims
and publishes are hundreds of such calls. The embedded redis-server and this process are pinned (sched_setaffinity)
to the same core (A) or to different ones (B), alternated A B A B ...; each side reports its median latency over the
alternations with the min–max. Paths: a PING through redis-py, and a learner's claim storing a fast-preset Hopper
gradient (40 kB) and taking the next task with the current weights (`bench_cache.claim_step`).

    python -m experiments.bench_cores [--seconds 0.5] [--repeats 3]
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import typer
from rich.console import Console

from cache import Cache, JobCache, JobLimits, connect
from experiments import bench_cache

SIDES = ("one core", "two cores")


@dataclass(frozen=True)
class CoreResult:
    path: str
    side: str
    latencies_us: tuple[float, ...]  # one median per alternation

    @property
    def median_us(self) -> float:
        return statistics.median(self.latencies_us)


def cores() -> list[int]:
    """The cores this process may run on; at least two are needed."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise RuntimeError(f"bench_cores needs two cores to run on, this process may use {allowed}")
    return allowed


@contextlib.contextmanager
def pinned(server_pid: int, server_core: int, client_core: int) -> Iterator[None]:
    """The server's threads and this thread on the given cores until the block ends; then back to all allowed."""
    allowed = set(cores())
    threads = [int(t) for t in os.listdir(f"/proc/{server_pid}/task")]
    try:
        for tid in threads:
            os.sched_setaffinity(tid, {server_core})
        os.sched_setaffinity(0, {client_core})
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):  # a server thread that ended meanwhile
                os.sched_setaffinity(tid, allowed)


def latency_us(fn: Callable[[], object], seconds: float) -> float:
    """Median wall time of one call over a window of `seconds` (after a few warm-up calls), in µs."""
    for _ in range(20):
        fn()
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def measure(cache: Cache, seconds: float, repeats: int, console: Console) -> list[CoreResult]:
    if cache.server is None or cache.server.pid is None:
        raise RuntimeError("bench_cores pins the embedded redis-server: run it without REDIS_URL")
    server_core, other = cores()[:2]
    job = JobCache(cache.client, f"bench-{uuid.uuid4().hex[:8]}", JobLimits())
    paths: dict[str, Callable[[], object]] = {
        "PING": cache.client.ping,
        "learner claim (40 kB gradient, weights back)": bench_cache.claim_step(job, bench_cache.mlp_gradient(64)),
    }
    got: dict[tuple[str, str], list[float]] = {(p, s): [] for p in paths for s in SIDES}
    try:
        for i in range(repeats):
            for side, client_core in zip(SIDES, (server_core, other), strict=True):
                console.log(f"round trips, {side} ({i + 1}/{repeats})")
                with pinned(cache.server.pid, server_core, client_core):
                    for path, fn in paths.items():
                        got[(path, side)].append(latency_us(fn, seconds))
    finally:
        job.delete()
    return [CoreResult(path, side, tuple(v)) for (path, side), v in got.items()]


def main(
    seconds: float = typer.Option(0.5, help="length of one timed window"),
    repeats: int = typer.Option(3, min=1, help="A/B alternations (one core, two cores); medians are reported"),
) -> None:
    console = Console(stderr=True)
    with connect() as cache:
        results = measure(cache, seconds, repeats, console)
    for r in results:
        lo, hi = min(r.latencies_us), max(r.latencies_us)
        print(f"{r.path}, {r.side}: {r.median_us:.0f} µs (min–max {lo:.0f}–{hi:.0f} over {len(r.latencies_us)})")


if __name__ == "__main__":
    typer.run(main)
