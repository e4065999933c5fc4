"""The actor stage of `python -m experiments.bench` against a real Redis: it builds its job as the functions do (it
broke once, unnoticed, when the job request changed shape)."""

from __future__ import annotations

from cache import Cache
from experiments import bench_actor


def test_the_actor_bench_measures_both_sides_on_a_real_redis(cache_conn: Cache) -> None:
    result = bench_actor.measure(cache_conn, repeats=1)
    assert result.platform_steps_per_s > 0 and result.bare_steps_per_s > 0 and len(result.pair_ratios) == 1
