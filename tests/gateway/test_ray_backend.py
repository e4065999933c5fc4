"""The gateway with the ray backend on a real 2-node Ray cluster on loopback (one cluster for the module): a CPU head
on 127.0.0.2 declaring {"cpu_node": 1}, and a node on 127.0.0.3 declaring 1 GPU and {"gpu_node": 1}. Real gateways
(`python -m gateway`) join it by address; the test process is a Ray driver too, to look at the actors.

Placement follows the spec's resources (the activation record names the node, and the answering process is one of
that node's by PID); the runtime refuses calls without the gateway's secret; a killed actor is replaced by the pool;
a spec that no node can take fails with a 502 naming what it asked for; a restarted gateway adopts the actors that
outlived the last one. At teardown no process of the cluster is left (by PID).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray

from contract.runtime_http import SECRET_HEADER
from gateway.backends.process.tree import alive, descendants, pids_naming
from gateway.backends.ray.cluster import LocalRayCluster, RayNode
from gateway.client import GatewayClient, GatewayError
from gateway.models import FunctionSpec, Resources
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway
from tests.procs import wait_pid_gone

pytestmark = pytest.mark.cluster  # starts Ray clusters: CI's long stage (make test-long, .ci/long-stage.sh)

H = "tests.gateway.identity_handlers"
PREFIXES = json.dumps(["functions.handlers.", "tests.functions.", "tests.gateway."])
CPU_IP, GPU_IP = "127.0.0.2", "127.0.0.3"
ON_GPU = {"gpus": 0.25, "custom": {"gpu_node": 0.01}}  # a learner's placement: a quarter GPU, on a GPU node
ON_CPU = {"custom": {"cpu_node": 0.01}}  # an actor's: on a CPU node
ON_GPU_NODE = {"custom": {"gpu_node": 0.01}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    local = LocalRayCluster(stop_timeout_s=20)
    seen: set[int] = set()
    try:
        local.start_head(node_ip=CPU_IP, num_cpus=2, resources={"cpu_node": 1})
        local.add_node(node_ip=GPU_IP, num_cpus=1, num_gpus=1, resources={"gpu_node": 1})
        yield local
        seen = local.pids()
    finally:
        temp_dir = local.temp_dir
        local.stop()
    assert seen, "the cluster had no processes to check"
    assert not [pid for pid in seen if alive(pid)], "Ray processes outlived the cluster's stop"
    assert not pids_naming(f"{temp_dir}{os.sep}"), "a process still names the cluster's temp dir"


@pytest.fixture(scope="module")
def driver(cluster: LocalRayCluster) -> Iterator[None]:
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    yield
    ray.shutdown()


def ray_gateway(redis_url: str, cluster: LocalRayCluster, namespace: str | None = None, **env: str) -> RunningGateway:
    settings = {
        "STELLARIS_GATEWAY_RAY_ADDRESS": cluster.address,
        "STELLARIS_GATEWAY_TARGET_PREFIXES": PREFIXES,
        "STELLARIS_GATEWAY_STOP_TIMEOUT_S": "5",
        "STELLARIS_GATEWAY_RAY_STARTUP_TIMEOUT_S": "60",
    }
    return start_gateway(redis_url, namespace, **{**settings, **env})


@pytest.fixture(scope="module")
def gateway(redis_server, cluster: LocalRayCluster) -> Iterator[RunningGateway]:
    gw = ray_gateway(redis_server.url, cluster)
    yield gw
    stop_gateway(gw)


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[GatewayClient]:
    with gateway.client() as c:
        yield c


def rspec(
    name: str, handler: str, *, gpus: float = 0, custom: dict[str, float] | None = None, **kw: Any
) -> FunctionSpec:
    resources = Resources(cpus=0.25, gpus=gpus, custom=custom or {})
    return FunctionSpec(name=name, backend="ray", target=f"{H}:{handler}", resources=resources, **kw)


def node_at(cluster: LocalRayCluster, ip: str) -> RayNode:
    return next(n for n in cluster.nodes if n.ip == ip)


def named_actors(namespace: str) -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace}


def named_actors_become(namespace: str, expected: set[str], timeout_s: float = 30.0) -> set[str]:
    """The namespace's named actors once they are `expected`, or as they are after `timeout_s`. A killed actor's name
    is released by the GCS a moment after ray.kill returns, and Ray offers no event for it: look again, backing off."""
    deadline, delay_s = time.monotonic() + timeout_s, 0.02
    while (names := named_actors(namespace)) != expected and time.monotonic() < deadline:
        time.sleep(delay_s)
        delay_s = min(0.5, delay_s * 2)
    return names


def instance_ids(c: GatewayClient, name: str) -> set[str]:
    return {i["id"] for i in c.function(name)["status"]["instances"]}


def fname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_each_instance_runs_on_a_node_that_has_its_resources(client: GatewayClient, cluster: LocalRayCluster) -> None:
    learner, actor = fname("learner"), fname("actor")
    client.register(rspec(learner, "red", **ON_GPU))
    client.register(rspec(actor, "green", **ON_CPU))
    try:
        for name, ip in ((learner, GPU_IP), (actor, CPU_IP)):
            result, meter = client.invoke_metered(name, {})
            assert meter.node == ip and meter.cold is True
            # Ray's placement, by PID: the process that answered is a worker of that node's raylet.
            assert result["pid"] in descendants(node_at(cluster, ip).pid)
            record = client.activation(client.invoke_async(name, {}), wait_s=30)
            assert (record.node, record.cold, record.instance) == (ip, False, result["instance"])
            [instance] = client.function(name)["status"]["instances"]
            assert instance["url"].startswith(f"http://{ip}:")
    finally:
        client.delete(learner)
        client.delete(actor)


def test_the_runtime_answers_only_calls_that_carry_the_secret(client: GatewayClient) -> None:
    name = fname("guarded")
    client.register(rspec(name, "red", min_warm=1, **ON_CPU))
    try:
        [instance] = client.function(name)["status"]["instances"]
        for method, path in (("POST", "/invoke"), ("GET", "/health"), ("GET", "/ready")):
            refused = httpx.request(method, f"{instance['url']}{path}", json={}, timeout=10)
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "Unauthorized"
        wrong = httpx.post(f"{instance['url']}/invoke", json={}, headers={SECRET_HEADER: "guess"}, timeout=10)
        assert wrong.status_code == 401
        assert client.invoke(name, {})["calls"] == 1  # the gateway sends it; the refused calls never ran
    finally:
        client.delete(name)


def call_after_a_crash(c: GatewayClient, name: str) -> dict[str, Any]:
    """The next answer after an instance died: the pool either probes the idle instance and replaces it before the
    call, or the call hits the dead instance (502 InstanceCrashed) and the one after goes to the replacement."""
    try:
        return c.invoke(name, {})
    except GatewayError as exc:
        assert (exc.status_code, exc.error["type"]) == (502, "InstanceCrashed"), exc
        return c.invoke(name, {})


def test_an_actor_killed_by_pid_or_by_ray_is_replaced(
    client: GatewayClient, gateway: RunningGateway, driver: None
) -> None:
    name = fname("crashy")
    client.register(rspec(name, "red", max_instances=1, **ON_CPU))  # one instance: the replacement serves next
    namespace = f"stellaris-{gateway.namespace}"
    try:
        first = client.invoke(name, {})
        os.kill(first["pid"], signal.SIGKILL)  # the actor's worker process, as the OOM killer would
        assert wait_pid_gone(first["pid"], 30)
        second = call_after_a_crash(client, name)
        assert second["instance"] != first["instance"] and second["pid"] != first["pid"]
        assert second["calls"] == 1
        assert instance_ids(client, name) == {second["instance"]}

        ray.kill(ray.get_actor(second["instance"], namespace=namespace), no_restart=True)
        assert wait_pid_gone(second["pid"], 30)
        third = call_after_a_crash(client, name)
        assert third["instance"] not in (first["instance"], second["instance"])
        assert instance_ids(client, name) == {third["instance"]}
        assert named_actors(namespace) >= {third["instance"]}
    finally:
        client.delete(name)
    assert named_actors_become(namespace, set()) == set()  # deleting the function stopped its actor


def test_a_spec_no_node_can_take_fails_with_a_502_naming_what_it_asked(
    redis_server, cluster: LocalRayCluster, driver: None
) -> None:
    gw = ray_gateway(redis_server.url, cluster, STELLARIS_GATEWAY_RAY_STARTUP_TIMEOUT_S="3")
    try:
        with gw.client() as c:
            for name, spec, asked in (
                ("tpu", rspec("tpu", "red", custom={"tpu_node": 1}), "{CPU: 0.25, tpu_node: 1}"),
                (
                    "gpus",
                    rspec("gpus", "red", gpus=2, custom={"gpu_node": 0.01}),
                    "{CPU: 0.25, GPU: 2, gpu_node: 0.01}",
                ),
            ):
                c.register(spec)
                with pytest.raises(GatewayError) as failed:
                    c.invoke(name, {})
                assert (failed.value.status_code, failed.value.error["type"]) == (502, "InstanceStartFailed")
                message = failed.value.error["message"]
                assert f"no Ray node has {asked} within 3 s" in message, message
                assert (
                    f"{GPU_IP} (CPU: 1, GPU: 1, gpu_node: 1)" in message
                    and f"{CPU_IP} (CPU: 2, cpu_node: 1)" in message
                )
                assert instance_ids(c, name) == set()
            assert named_actors_become(f"stellaris-{gw.namespace}", set()) == set()  # the pending actors were killed
    finally:
        stop_gateway(gw)


def test_a_restarted_gateway_adopts_the_actors_that_outlived_it(
    redis_server, cluster: LocalRayCluster, driver: None
) -> None:
    first = ray_gateway(redis_server.url, cluster)
    namespace = f"stellaris-{first.namespace}"
    with first.client() as c:
        c.register(rspec("keep", "red", min_warm=1, **ON_CPU))
        c.register(rspec("keep-gpu", "green", min_warm=1, **ON_GPU))
        c.register(rspec("lost", "blue", min_warm=1, **ON_CPU))
        before = {name: c.invoke(name, {}) for name in ("keep", "keep-gpu", "lost")}
    stop_gateway(first)  # a given cluster's actors outlive a gateway stop, like containers
    assert named_actors(namespace) == {answer["instance"] for answer in before.values()}
    ray.kill(ray.get_actor(before["lost"]["instance"], namespace=namespace), no_restart=True)
    assert wait_pid_gone(before["lost"]["pid"], 30)

    second = ray_gateway(redis_server.url, cluster, first.namespace)
    try:
        with second.client() as c:
            for name in ("keep", "keep-gpu"):
                assert instance_ids(c, name) == {before[name]["instance"]}
                after = c.invoke(name, {})
                assert (after["instance"], after["pid"]) == (before[name]["instance"], before[name]["pid"])
                assert after["calls"] == before[name]["calls"] + 1  # warm state intact: nothing started again
            replaced = c.invoke("lost", {})  # its actor died meanwhile: not adopted, a new one serves
            assert replaced["instance"] != before["lost"]["instance"] and replaced["calls"] == 1
            for name in ("keep", "keep-gpu", "lost"):
                c.delete(name)
        assert named_actors_become(namespace, set()) == set()
    finally:
        stop_gateway(second)
