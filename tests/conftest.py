"""Shared fixtures: one real redis-server per test session (per xdist worker), and a real 3-master Redis Cluster for
the tests that ask for one; never a stand-in."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cache import Cache, CacheSettings, JobCache, JobLimits
from cache.cluster_server import EmbeddedRedisCluster
from cache.server import EmbeddedRedis
from tests.procs import pid_alive


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """xdist runs two workers on two cores: more torch threads per worker only oversubscribe them."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(maxmemory_bytes=1024**3).start()
    pid = server.pid
    assert pid is not None and pid_alive(pid)
    yield server
    server.stop()
    assert not pid_alive(pid), f"redis-server pid {pid} outlived the test session"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedRedisCluster]:
    """A private 3-master Redis Cluster, started the first time a test asks for it."""
    cluster = EmbeddedRedisCluster(masters=3, maxmemory_bytes=256 * 1024**2).start()
    pids = cluster.pids
    assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)
    yield cluster
    cluster.stop()
    assert not any(pid_alive(pid) for pid in pids), f"Redis Cluster pids {pids} outlived the test session"


@pytest.fixture(scope="session")
def cache_conn(redis_server: EmbeddedRedis) -> Iterator[Cache]:
    with Cache(CacheSettings(url=redis_server.url)) as cache:
        yield cache


@pytest.fixture
def job_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def job(cache_conn: Cache, job_id: str) -> Iterator[JobCache]:
    jc = JobCache(cache_conn.client, job_id, JobLimits(backpressure_timeout_s=5.0))
    yield jc
    jc.delete()
