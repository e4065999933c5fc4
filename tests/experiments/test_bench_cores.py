"""bench_cores against a real embedded redis-server: both sides measured each alternation, and the pinning undone."""

import os

from rich.console import Console

from cache import connect
from experiments import bench_cores


def test_both_sides_are_measured_each_alternation_and_every_affinity_is_restored() -> None:
    allowed = os.sched_getaffinity(0)
    with connect() as cache:
        assert cache.server is not None and cache.server.pid is not None
        server_threads = os.listdir(f"/proc/{cache.server.pid}/task")
        before = {t: os.sched_getaffinity(int(t)) for t in server_threads}
        results = bench_cores.measure(cache, seconds=0.02, repeats=2, console=Console(quiet=True))
        after = {t: os.sched_getaffinity(int(t)) for t in server_threads}
    assert os.sched_getaffinity(0) == allowed
    assert after == before
    assert {(r.path, r.side) for r in results} == {
        (path, side) for path in ("PING", "learner claim (40 kB gradient, weights back)") for side in bench_cores.SIDES
    }
    assert all(len(r.latencies_us) == 2 and all(v > 0 for v in r.latencies_us) for r in results)
