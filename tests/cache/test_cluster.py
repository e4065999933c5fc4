"""The embedded Redis Cluster and the cluster URL: a real 3-master cluster, every key of a job in one slot, jobs
spread over the masters, a node restart ridden out, and clear errors for a URL that does not fit the server."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache import Cache, CacheError, CacheSettings, JobCache, LearnerTask
from cache.cluster_server import BUS_PORT_OFFSET, EmbeddedRedisCluster
from cache.keys import JobKeys
from cache.server import EmbeddedRedis
from tests.cache.test_streams import batch
from tests.procs import pid_alive, wait_pid_gone


def _node(cluster: EmbeddedRedisCluster, port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, password=cluster.password)


def test_three_masters_share_the_slots_and_all_see_the_cluster_ok(redis_cluster: EmbeddedRedisCluster) -> None:
    assert redis_cluster.url.startswith(f"redis+cluster://:{redis_cluster.password}@127.0.0.1:")
    assert len(redis_cluster.pids) == 3 and all(pid_alive(pid) for pid in redis_cluster.pids)
    assert all(port + BUS_PORT_OFFSET <= 65_535 for port in redis_cluster.ports)
    owned = 0
    for port in redis_cluster.ports:
        with _node(redis_cluster, port) as node:
            info = node.cluster("INFO")
            assert info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3
            assert node.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
            assert node.config_get("appendonly")["appendonly"] == "no" and node.config_get("save")["save"] == ""
            myself = next(n for n in node.cluster("NODES").values() if "myself" in n["flags"])
            owned += sum(
                int(hi) - int(lo) + 1 for lo, hi in (r if len(r) == 2 else (r[0], r[0]) for r in myself["slots"])
            )
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0)).ping()  # private: a password
    assert owned == 16_384


@pytest.fixture(scope="module")
def cluster_cache(redis_cluster: EmbeddedRedisCluster) -> Iterator[Cache]:
    with Cache(CacheSettings(url=redis_cluster.url)) as cache:
        yield cache


def test_every_key_of_a_job_sits_in_one_slot_and_jobs_spread_over_the_masters(cluster_cache: Cache, job_id: str):
    client = cluster_cache.client
    assert cluster_cache.cluster and isinstance(client, redis.cluster.RedisCluster)
    jobs = [JobCache(client, f"{job_id}-{i}") for i in range(8)]
    masters: set[str] = set()
    try:
        for job in jobs:
            job.policies.initialise(b"w0")
            job.trajectories.put(batch(steps=3))
            job.board.enqueue([LearnerTask(1, ("b1",), 0, 0, 1)], close_round=1, timeout_s=5)
            keys = list(client.scan_iter(match=job.keys.pattern(), count=500))
            assert len(keys) >= 5
            slots = {client.keyslot(key) for key in keys}
            assert slots == {client.keyslot(JobKeys(job.keys.job).base)}, keys
            masters.add(client.get_node_from_key(keys[0]).name)
        assert len(masters) > 1  # the cluster really shards: jobs land on different masters
    finally:
        for job in jobs:
            job.delete()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("unix+cluster:///tmp/redis.sock", r"must start with redis://, rediss://, unix://, redis\+cluster:// or "),
        ("redis+cluster://127.0.0.1:1/0x", "cannot reach Redis Cluster"),
    ],
)
def test_a_url_of_no_accepted_scheme_or_shape_is_refused_by_name(url: str, match: str) -> None:
    with pytest.raises(CacheError, match=match):
        Cache(CacheSettings(url=url, reconnect_window_s=0))


def test_a_cluster_url_for_a_single_server_and_the_reverse_are_refused_with_the_fix(
    redis_server: EmbeddedRedis, redis_cluster: EmbeddedRedisCluster
) -> None:
    single_as_cluster = redis_server.url.replace("redis://", "redis+cluster://").removesuffix("/0")
    with pytest.raises(CacheError, match=r"cannot reach Redis Cluster at redis\+cluster://:\*\*\*@.*not enabled"):
        Cache(CacheSettings(url=single_as_cluster, reconnect_window_s=0))
    node_as_single = redis_cluster.url.replace("redis+cluster://", "redis://")
    with pytest.raises(CacheError, match=r"is a Redis Cluster node: use a redis\+cluster://"):
        Cache(CacheSettings(url=node_as_single, reconnect_window_s=0))
    with pytest.raises(CacheError, match=r"db.* can only be 0 in cluster mode"):
        Cache(CacheSettings(url=f"{redis_cluster.url}/2", reconnect_window_s=0))


def test_a_cluster_needs_three_masters() -> None:
    with pytest.raises(ValueError, match="at least 3 masters, got 2"):
        EmbeddedRedisCluster(masters=2)


@pytest.fixture(scope="module")
def aof_cluster() -> Iterator[EmbeddedRedisCluster]:
    cluster = EmbeddedRedisCluster(maxmemory_bytes=64 * 1024**2, appendonly=True).start()
    yield cluster
    cluster.stop()


def test_stop_leaves_no_process_and_no_directory() -> None:
    cluster = EmbeddedRedisCluster(maxmemory_bytes=32 * 1024**2).start()
    pids, workdir = cluster.pids, cluster.workdir
    assert workdir is not None and workdir.exists() and len(pids) == 3
    cluster.stop()
    assert all(wait_pid_gone(pid, 10) for pid in pids), f"cluster nodes {pids} outlived stop()"
    assert not workdir.exists()


def test_a_command_while_its_master_restarts_completes_once_it_is_back(aof_cluster: EmbeddedRedisCluster) -> None:
    with Cache(CacheSettings(url=aof_cluster.url, reconnect_window_s=20)) as cache:
        client = cache.client
        assert isinstance(client, redis.cluster.RedisCluster)
        client.set("stl:{restart}:k", "before")
        port = client.get_node_from_key("stl:{restart}:k").port
        node = next(n for n in aof_cluster.nodes if n.port == port)
        assert node.pid is not None
        os.kill(node.pid, signal.SIGKILL)
        assert wait_pid_gone(node.pid, 10)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(client.get("stl:{restart}:k")))  # sent while it is down
        reader.start()
        time.sleep(1.0)  # the outage
        node.restart()  # from this thread: a node dies with the thread that started it
        reader.join(timeout=30)
        assert got == [b"before"]  # answered from the restarted master's AOF
        assert client.incr("stl:{restart}:n") == 1  # a write after the restart, applied once
        assert cache.retry.retried > 0
        assert node.cluster_ok.wait(30)  # and the node sees the cluster whole again
