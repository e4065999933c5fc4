"""A real gateway on a Redis Cluster URL: its registry, activation records and waits, and its functions' own cache
clients (the process backend hands them the cluster URL), all on a 3-master cluster."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.cluster

from cache import Cache, CacheSettings
from cache.cluster_server import EmbeddedRedisCluster
from cache.connection import credentials_env
from cache.keys import GatewayKeys
from gateway.client import GatewayClient
from gateway.models import FunctionSpec
from gateway.redis_client import GatewayCluster, gateway_redis
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway

H = "tests.functions.sample_handlers"


@pytest.fixture(scope="module")
def cluster_gateway(redis_cluster: EmbeddedRedisCluster) -> Iterator[RunningGateway]:
    gw = start_gateway(redis_cluster.url)
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def cluster_cache(redis_cluster: EmbeddedRedisCluster) -> Iterator[Cache]:
    with Cache(CacheSettings(url=redis_cluster.url)) as cache:
        yield cache


def test_register_invoke_and_activation_records_through_a_gateway_on_a_cluster(
    cluster_gateway: RunningGateway, cluster_cache: Cache
) -> None:
    client = cluster_cache.client
    assert isinstance(client, redis.cluster.RedisCluster)
    keys = GatewayKeys(cluster_gateway.namespace)
    echo, waiter = f"echo-{uuid.uuid4().hex[:8]}", f"wait-{uuid.uuid4().hex[:8]}"
    with cluster_gateway.client() as gw:
        gw.register(FunctionSpec(name=echo, target=f"{H}:echo"))
        gw.register(
            FunctionSpec(
                name=waiter, target=f"{H}:wait_for_release", timeout_s=30, env=credentials_env(cluster_cache.url)
            )
        )
        assert {echo, waiter} <= {name.decode() for name in client.hkeys(keys.functions)}

        call_id, body = gw.invoke_with_id(echo, {"x": 1})
        assert body == {"event": {"x": 1}, "call_id": call_id}
        act = gw.activation(call_id, wait_s=10)
        assert act.status == "success" and act.result == body and act.function == echo

        # The function's own cache client is a cluster client too: it announces the call, then blocks on a list the
        # test pushes to; the gateway's waiter blocks on the activation's end (BLMOVE) meanwhile.
        tag = f"stl:{{gw-test-{uuid.uuid4().hex[:8]}}}"
        event = {"started_key": f"{tag}:started", "release_key": f"{tag}:release", "timeout_s": 30}
        act_id = _invoke_async(gw, waiter, event)
        started = client.blpop([event["started_key"]], timeout=30)
        assert started is not None and started[1].decode() == act_id
        assert gw.activation(act_id).status in ("queued", "running")
        client.rpush(event["release_key"], "go")
        done = gw.activation(act_id, wait_s=30)
        assert done.status == "success" and done.result == {"released": True}

    # The records live in the cluster, in the namespace's slot, and the index counts both calls.
    assert client.exists(keys.activation(call_id), keys.activation(act_id)) == 2
    assert client.zscore(keys.activations, call_id) is not None and client.zscore(keys.activations, act_id) is not None
    slots = {client.keyslot(k) for k in (keys.functions, keys.activations, keys.activation(call_id))}
    assert len(slots) == 1
    client.delete(f"{tag}:started", f"{tag}:release")


def _invoke_async(gw: GatewayClient, name: str, event: dict[str, object]) -> str:
    resp = gw.http.post(f"/async-function/{name}", json=event)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["activation_id"])


def test_the_gateways_cluster_client_is_bounded_and_makes_requests_wait(cluster_cache: Cache) -> None:
    key = f"stl:gw:{{bound-{uuid.uuid4().hex[:8]}}}:n"

    async def scenario() -> None:
        client = gateway_redis(cluster_cache, max_connections=1, wait_s=5.0)
        assert isinstance(client, GatewayCluster)
        try:

            async def pipelined() -> list[object]:
                async with client.pipeline(transaction=True) as pipe:
                    pipe.incr(key)
                    pipe.pexpire(key, 60_000)
                    return await pipe.execute()

            # 40 concurrent commands and transactions through one place: they queue for it, none fails.
            done = await asyncio.gather(*(client.incr(key) if i % 2 else pipelined() for i in range(40)))
            assert len(done) == 40 and int(await client.get(key)) == 40
            impatient = gateway_redis(cluster_cache, max_connections=1, wait_s=0.2)
            assert isinstance(impatient, GatewayCluster)
            taken, release = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                async with impatient.slot():
                    taken.set()
                    await release.wait()

            holder = asyncio.ensure_future(hold())
            try:
                await taken.wait()  # another request holds the only place: this one waits 0.2 s, then fails
                with pytest.raises(redis.ConnectionError, match=r"no free Redis connection within 0\.2 s"):
                    await impatient.get(key)
            finally:
                release.set()
                await holder
                await impatient.aclose()
        finally:
            await client.delete(key)
            await client.aclose()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match=r"must be positive, got 0 and 1\.0"):
        gateway_redis(cluster_cache, max_connections=0, wait_s=1.0)
