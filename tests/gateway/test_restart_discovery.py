"""A gateway killed with SIGKILL (a real process, by its PID) and started again: every function's calls are
answered by that function's own instances. Three functions whose handlers answer differently
(tests/gateway/identity_handlers.py), with different numbers of warm instances.

- process backend: the instances die with the gateway (PR_SET_PDEATHSIG); the new gateway starts each function's
  own instances again.
- docker backend: the containers outlive it; the new gateway adopts each into its own function's pool (same
  container ids, warm state intact, nothing started again), stops the containers of a function no longer
  registered and of a replaced spec, and leaves another namespace's containers alone. Skips (saying why) without
  an engine unless STELLARIS_REQUIRE_DOCKER=1, as the other docker tests.

Two tests need neither: which pool takes which found instance (gateway/discovery.py), and the labels that let it
decide (function, spec digest, namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

import aiohttp
from docker.client import DockerClient
from docker.errors import APIError, NotFound

from cache import Cache
from cache.keys import GatewayKeys
from gateway.backends.base import LABEL_FUNCTION, LABEL_GATEWAY, LABEL_NAMESPACE, LABEL_SPEC, InstanceHandle
from gateway.backends.docker.backend import DockerBackend
from gateway.backends.process.backend import ProcessBackend
from gateway.client import GatewayClient
from gateway.discovery import sort_survivors
from gateway.metering import Metrics
from gateway.models import FunctionSpec
from gateway.pool import FunctionPool
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway
from tests.gateway.test_docker_backend import IMAGE, engine  # noqa: F401 (fixture)
from tests.gateway.test_docker_gateway import docker_gateway, gateway_id  # noqa: F401 (fixture)
from tests.procs import pid_alive, wait_pid_gone

H = "tests.gateway.identity_handlers"
PREFIXES = json.dumps(["functions.handlers.", "tests.functions.", "tests.gateway."])
WARM = {"red": 1, "green": 2, "blue": 1}  # function (and handler) name -> min_warm


def kill_gateway(gw: RunningGateway) -> None:
    """SIGKILL: no lifespan shutdown, no draining; the instances are left as a crash leaves them."""
    os.kill(gw.proc.pid, signal.SIGKILL)
    gw.proc.wait(timeout=30)
    assert wait_pid_gone(gw.proc.pid, 5)


def instances(c: GatewayClient, name: str) -> list[dict[str, Any]]:
    return list(c.function(name)["status"]["instances"])


def answers(c: GatewayClient, name: str, calls: int = 3) -> list[dict[str, Any]]:
    """`calls` answers of `name`, each checked to come from its own handler."""
    out = [c.invoke(name, {}) for _ in range(calls)]
    assert [a["kind"] for a in out] == [name] * calls, f"calls to {name!r} answered by {out}"
    return out


# -- no engine, no gateway process: who takes what --------------------------------------------------------------


def test_each_found_instance_goes_to_its_own_functions_pool_and_the_rest_is_stopped_or_left() -> None:
    specs = {n: FunctionSpec(name=n, backend="process", target=f"{H}:{n}", max_instances=2) for n in WARM}

    def found(instance: str, function: str, *, digest: str | None = None, backend: str = "process") -> InstanceHandle:
        own = specs[function].digest() if function in specs else "0" * 16
        return InstanceHandle(instance, function, "http://127.0.0.1:9", backend, spec_digest=digest or own)

    survivors = [
        found("red-1", "red"),
        found("green-1", "green"),
        found("blue-1", "blue"),
        found("green-2", "green"),
        found("green-3", "green"),  # beyond green's max_instances
        found("blue-old", "blue", digest="f" * 16),  # started for an earlier spec of blue
        found("red-docker", "red", backend="docker"),  # red runs on the process backend now
        found("gone-1", "gone"),  # no longer registered
        found("new-1", "new"),  # registered after this gateway read its registry: another gateway process's
    ]

    async def sort() -> tuple[dict[str, set[str]], set[str], set[str]]:
        async with aiohttp.ClientSession() as http:
            backend, metrics = ProcessBackend(), Metrics()
            pools = {n: FunctionPool(s, backend, http, metrics, stop_timeout_s=1) for n, s in specs.items()}
            out = sort_survivors(survivors, pools, registered={*specs, "new"})
            taken = {n: set(p.instances) for n, p in pools.items()}
            assert {n: {h.id for h in hs} for n, hs in out.adopted.items()} == taken
            for pool in pools.values():
                await pool.close(stop_instances=False)
            return taken, {h.id for h in out.stopped}, {h.id for h in out.left}

    taken, stopped, left = asyncio.run(sort())
    assert taken == {"red": {"red-1"}, "green": {"green-1", "green-2"}, "blue": {"blue-1"}}
    assert stopped == {"green-3", "blue-old", "red-docker", "gone-1"}
    assert left == {"new-1"}


def test_a_container_names_its_function_spec_namespace_and_instance() -> None:
    spec = FunctionSpec(name="red", backend="docker", image=IMAGE, target=f"{H}:red")
    config = DockerBackend(gateway_id="gw", namespace="ns").container_config(spec, instance_id="red-1")
    labels = config["labels"]
    assert labels[LABEL_FUNCTION] == "red" and labels[LABEL_NAMESPACE] == "ns"
    assert labels[LABEL_SPEC] == spec.digest() != spec.model_copy(update={"env": {"V": "2"}}).digest()
    assert config["environment"]["STELLARIS_INSTANCE_ID"] == "red-1"
    assert (
        f"{LABEL_NAMESPACE}=ns" in DockerBackend(gateway_id="gw", namespace="ns").template.discovery_filters()["label"]
    )
    bare = DockerBackend(gateway_id="gw")  # no namespace: every namespace's containers of this gateway id
    assert LABEL_NAMESPACE not in bare.container_config(spec, instance_id="red-1")["labels"]
    assert not any(LABEL_NAMESPACE in f for f in bare.template.discovery_filters()["label"])


# -- process backend -------------------------------------------------------------------------------------------


def test_process_instances_die_with_a_killed_gateway_and_each_function_gets_its_own_again(redis_server) -> None:
    first = start_gateway(redis_server.url, STELLARIS_GATEWAY_TARGET_PREFIXES=PREFIXES)
    with first.client() as c:
        for name, warm in WARM.items():
            c.register(FunctionSpec(name=name, backend="process", target=f"{H}:{name}", min_warm=warm))
        for name in WARM:
            answers(c, name, 1)
        old = {name: {i["pid"] for i in instances(c, name)} for name in WARM}
    assert [len(pids) for pids in old.values()] == list(WARM.values())
    kill_gateway(first)
    for pid in set().union(*old.values()):
        assert wait_pid_gone(pid, 30), f"instance pid {pid} outlived its SIGKILLed gateway"

    second = start_gateway(redis_server.url, first.namespace, STELLARIS_GATEWAY_TARGET_PREFIXES=PREFIXES)
    try:
        with second.client() as c:
            for name in WARM:
                got = answers(c, name)
                now = instances(c, name)
                assert all(i["id"].startswith(f"{name}-") for i in now)
                assert {a["instance"] for a in got} <= {i["id"] for i in now}
                assert {a["pid"] for a in got} <= {i["pid"] for i in now}
                assert not {i["pid"] for i in now} & set().union(*old.values())
            for name in WARM:
                c.delete(name)
    finally:
        stop_gateway(second)


# -- docker backend --------------------------------------------------------------------------------------------


def restart_gateway(redis_url: str, gid: str, namespace: str | None = None) -> RunningGateway:
    """test_docker_gateway's host-Python gateway, taking this module's handlers, with a short stop timeout."""
    return docker_gateway(
        redis_url, gid, namespace, STELLARIS_GATEWAY_TARGET_PREFIXES=PREFIXES, STELLARIS_GATEWAY_STOP_TIMEOUT_S="5"
    )


def dspec(name: str, handler: str, min_warm: int) -> FunctionSpec:
    return FunctionSpec(name=name, backend="docker", image=IMAGE, target=f"{H}:{handler}", min_warm=min_warm)


def container_ids(c: GatewayClient, name: str) -> set[str]:
    return {i["container_id"] for i in instances(c, name)}


def wait_stopped(engine: DockerClient, cid: str) -> None:  # noqa: F811
    # Gone already: NotFound, or (podman, removed while asked) a 500 "no such container".
    with contextlib.suppress(NotFound, APIError):
        engine.containers.get(cid).wait(timeout=60)  # blocks until the container stops
    # The low-level list (no inspect per container, which a container removed meanwhile would fail with a 500).
    assert "running" not in [ct["State"] for ct in engine.api.containers(all=True, filters={"id": cid})]


def assert_adopted(
    c: GatewayClient, name: str, containers: set[str], instance_ids: set[str], warm_state: dict[str, Any]
) -> None:
    """The restarted gateway serves `name` from its containers and instances from before the restart."""
    assert container_ids(c, name) == containers, f"{name!r} adopted the wrong containers"
    assert {i["id"] for i in instances(c, name)} == instance_ids
    got = answers(c, name)
    assert {a["instance"] for a in got} <= instance_ids
    if WARM[name] == 1:  # its one instance, warm state intact: adopted, not started again
        assert [a["calls"] for a in got] == [2, 3, 4] and got[0]["pid"] == warm_state["pid"]
    result, act = c.invoke_metered(name, {})
    assert result["kind"] == name and act.cold is False
    assert act.container_id in containers and act.image == IMAGE
    call_id, _ = c.invoke_with_id(name, {})
    record = c.activation(call_id, wait_s=5)
    assert record.container_id in containers and record.image == IMAGE
    assert record.instance in instance_ids


def test_a_restarted_gateway_adopts_each_container_into_its_own_function(
    redis_server,
    cache_conn: Cache,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,  # noqa: F811
) -> None:
    # Another namespace's gateway with the same gateway id (two gateways on one host) and a function also named
    # "red": its container must be neither adopted nor stopped by the restarted gateway.
    other = restart_gateway(redis_server.url, gateway_id)
    first = restart_gateway(redis_server.url, gateway_id)
    second: RunningGateway | None = None
    try:
        with other.client() as c:
            c.register(dspec("red", "red", 1))
            [other_red] = container_ids(c, "red")
        with first.client() as c:
            for name, warm in WARM.items():
                c.register(dspec(name, name, warm))
            c.register(dspec("gone", "red", 1))  # deleted from the registry while the gateway is down
            c.register(dspec("stale", "blue", 1))  # its spec replaced while the gateway is down
            warm_state = {name: answers(c, name, 1)[0] for name in WARM}  # one call each: calls == 1
            before = {name: container_ids(c, name) for name in [*WARM, "gone", "stale"]}
            ids_before = {name: {i["id"] for i in instances(c, name)} for name in WARM}
        assert [len(before[name]) for name in WARM] == list(WARM.values())

        kill_gateway(first)
        ours = set().union(*before.values())
        assert {ct.id for ct in engine.containers.list()} >= ours | {other_red}  # containers outlive the gateway
        keys = GatewayKeys(first.namespace)
        cache_conn.client.hdel(keys.functions, "gone")
        stale = FunctionSpec.model_validate_json(cache_conn.client.hget(keys.functions, "stale"))
        cache_conn.client.hset(keys.functions, "stale", stale.model_copy(update={"env": {"V": "2"}}).model_dump_json())

        second = restart_gateway(redis_server.url, gateway_id, namespace=first.namespace)
        with second.client() as c:
            for name in WARM:
                assert_adopted(c, name, before[name], ids_before[name], warm_state[name])
            for cid in before["gone"] | before["stale"]:
                wait_stopped(engine, cid)
            assert c.invoke("stale", {})["kind"] == "blue"
            assert not container_ids(c, "stale") & before["stale"]  # a new container, for the new spec
            assert engine.containers.get(other_red).status == "running"
            assert other_red not in container_ids(c, "red")
            # Nothing of red, green or blue was started again: their containers are the ones from before. Asked by
            # their own labels: the other functions' containers come and go on their own (a stale one being
            # removed may still be listed as running for a moment, by podman).
            for name in WARM:
                ours_now = [f"{LABEL_GATEWAY}={gateway_id}", f"{LABEL_NAMESPACE}={first.namespace}"]
                running = engine.containers.list(filters={"label": [*ours_now, f"{LABEL_FUNCTION}={name}"]})
                assert {ct.id for ct in running} == before[name], f"{name!r} was started again"
            for name in [*WARM, "stale"]:
                c.delete(name)
        with other.client() as c:
            c.delete("red")
    finally:
        for gw in (other, first, second):
            if gw is not None and gw.proc.poll() is None:
                stop_gateway(gw)
    for pid in (other.proc.pid, first.proc.pid):
        assert not pid_alive(pid)
