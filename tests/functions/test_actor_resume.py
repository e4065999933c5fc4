"""A resumed job's actors start from the reward-scaler moments its checkpoint put in the cache (real Redis)."""

import json

import pytest

from cache import Cache
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec


def test_an_actor_starts_from_the_reward_scaler_moments_in_the_cache(cache_conn: Cache, job_id: str) -> None:
    spec = small_spec(job_id)
    spec = spec.model_copy(update={"algo": spec.algo.model_copy(update={"normalize_reward": True})})
    driver = Driver(cache_conn, spec, actors=2)
    try:
        driver.job.client.hset(driver.job.keys.actor_scalers, "actor-0", json.dumps([5.0, 4.0, 1000.0]))
        for i in range(2):  # one batch each: 64 steps x 2 envs
            driver.actor({"job": job_id, "actor_id": f"actor-{i}", "actor_index": i})
        taken = driver.job.trajectories.take("test", count=2, block_s=5.0)
        moments = {meta.actor_id: meta.info["reward_scaler"] for _, meta in taken}
        assert moments["actor-0"][2] == pytest.approx(1000.0 + 128)  # went on from the stored count
        assert moments["actor-1"][2] == pytest.approx(1e-4 + 128)  # nothing stored: a fresh scaler
    finally:
        driver.job.delete()
