"""The ray backend's pieces that need no Ray: the loopback-cache refusal, the not-placed message, what an actor is
asked for, the local cluster's argument checks, and the /proc process helpers its stop relies on (on real
subprocesses)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gateway.backends.base import BackendError
from gateway.backends.process.tree import SpawnThread, alive, descendants, kill_all, pids_naming, session_members
from gateway.backends.ray.checks import is_local_address, redis_location, refuse_loopback_cache, unplaced_reason
from gateway.backends.ray.cluster import LocalRayCluster, RayClusterError
from host.lifetime import die_with_parent
from tests.procs import wait_pid_gone

THIS_MACHINE = {"192.168.7.7"}  # what the injected test calls this machine's own (non-loopback) address


def local(address: str) -> bool:
    return address.startswith("127.") or address in THIS_MACHINE


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:secret-password@127.0.0.1:41234",
        "redis://localhost:6379",
        "redis://[::1]:6379",
        "rediss://user:pw@127.0.0.2:6380/1",
        "unix:///tmp/redis.sock",
    ],
)
def test_a_loopback_cache_is_refused_when_a_node_is_on_another_machine(url: str) -> None:
    with pytest.raises(BackendError) as refused:
        refuse_loopback_cache(url, ["127.0.0.2", "10.1.2.3", "192.168.7.7", "10.1.2.4"], is_local=local)
    message = str(refused.value)
    assert "listens on loopback, but Ray nodes 10.1.2.3, 10.1.2.4 are on other machines" in message
    assert "give REDIS_URL a Redis every node can reach" in message
    assert "password" not in message and "pw@" not in message  # credentials never reach a message


@pytest.mark.parametrize(
    ("url", "nodes"),
    [
        ("redis://127.0.0.1:6379", ["127.0.0.2", "127.0.0.3"]),  # a loopback cluster on this machine
        ("redis://127.0.0.1:6379", ["192.168.7.7"]),  # a node on one of this machine's own addresses
        ("redis://10.0.0.5:6379", ["10.1.2.3", "10.1.2.4"]),  # a Redis every node can reach
        (None, ["10.1.2.3"]),  # no REDIS_URL for the instances at all
    ],
)
def test_a_cache_the_nodes_can_reach_is_accepted(url: str | None, nodes: list[str]) -> None:
    refuse_loopback_cache(url, nodes, is_local=local)


def test_the_redis_location_drops_credentials() -> None:
    assert redis_location("redis://:pw@127.0.0.1:41234/0") == ("redis://127.0.0.1:41234", True)
    assert redis_location("rediss://u:pw@cache.example:6380") == ("rediss://cache.example:6380", False)
    assert redis_location("unix:///run/redis.sock") == ("unix:///run/redis.sock", True)


def test_this_machines_addresses_are_local_and_others_are_not() -> None:
    assert is_local_address("127.0.0.3") and is_local_address("::1") and is_local_address("localhost")
    assert not is_local_address("192.0.2.1")  # TEST-NET-1: never assigned to a machine
    assert not is_local_address("no-such-host.invalid")


def node(ip: str, alive: bool = True, **resources: float) -> dict[str, Any]:
    bookkeeping = {f"node:{ip}": 1.0, "memory": 1e10, "object_store_memory": 1e8}
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": {**bookkeeping, **resources}}


NODES = [node("127.0.0.2", CPU=2, cpu_node=1), node("127.0.0.3", CPU=1, GPU=1, gpu_node=1), node("10.0.0.9", False)]


def test_the_not_placed_message_says_no_node_has_what_was_asked() -> None:
    message = unplaced_reason({"CPU": 0.25, "tpu_node": 1}, NODES, 3.0)
    assert message == (
        "no Ray node has {CPU: 0.25, tpu_node: 1} within 3 s; alive nodes: 127.0.0.2 (CPU: 2, cpu_node: 1); "
        "127.0.0.3 (CPU: 1, GPU: 1, gpu_node: 1)"
    )
    assert "no Ray node has {CPU: 1, GPU: 2}" in unplaced_reason({"CPU": 1, "GPU": 2}, NODES, 3.0)


def test_the_not_placed_message_names_the_nodes_that_could_but_are_busy() -> None:
    message = unplaced_reason({"CPU": 1, "GPU": 0.25, "gpu_node": 0.01}, NODES, 60.0)
    assert message.startswith("not serving with {CPU: 1, GPU: 0.25, gpu_node: 0.01} (nodes 127.0.0.3 have that much")
    assert unplaced_reason({"CPU": 1}, [], 5.0) == "no Ray node has {CPU: 1} within 5 s; alive nodes: none"


def test_a_local_cluster_is_used_in_order() -> None:
    cluster = LocalRayCluster()
    try:
        with pytest.raises(RayClusterError, match="no head yet"):
            _ = cluster.address
        with pytest.raises(RayClusterError, match="no head yet"):
            cluster.add_node(node_ip="127.0.0.3")
        with pytest.raises(RayClusterError, match="num_gpus -1 must be >= 0"):
            cluster.start_head(num_cpus=1, num_gpus=-1)
        assert cluster.pids() == set()
    finally:
        cluster.stop()
    assert not cluster.temp_dir.exists()  # its own temp dir goes with it


GRANDCHILD = "import time; time.sleep(60)"
CHILD = f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{GRANDCHILD!r}]); print('up',flush=True); "
CHILD += "time.sleep(60)"
PARENT = f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{CHILD!r}]); time.sleep(60)"


def test_a_process_tree_and_its_session_are_found_and_killed_even_once_orphaned() -> None:
    """A parent in its own session (die_with_parent), its child and grandchild (which share its stdout pipe)."""
    spawner = SpawnThread()  # the parent dies with this thread (PR_SET_PDEATHSIG): closed last
    parent = spawner.run(
        lambda: subprocess.Popen(
            [sys.executable, "-c", PARENT, "marker-7f3a"], stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent
        )
    )
    leftovers: set[int] = set()
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "up\n"  # the grandchild is started
        tree = descendants(parent.pid)
        assert len(tree) == 2
        assert session_members({parent.pid}) == {parent.pid} | tree
        assert pids_naming("marker-7f3a") == {parent.pid}
        parent.kill()
        parent.wait()
        # Orphaned: no longer anyone's descendants, still in the parent's session.
        assert all(alive(pid) for pid in tree) and descendants(parent.pid) == set()
        assert session_members({parent.pid}) == tree
    finally:
        leftovers = session_members({parent.pid})
        kill_all(leftovers)
        parent.kill()
        parent.wait()
        spawner.close()
    assert all(wait_pid_gone(pid, 10) for pid in leftovers)


def test_a_child_started_from_the_spawn_thread_dies_with_that_thread() -> None:
    spawner = SpawnThread()
    child = spawner.run(lambda: subprocess.Popen([sys.executable, "-c", GRANDCHILD], preexec_fn=die_with_parent))
    try:
        assert child.poll() is None
        with pytest.raises(ZeroDivisionError):
            spawner.run(lambda: 1 / 0)  # an error is raised in the caller, and the thread serves on
        assert child.poll() is None
    finally:
        spawner.close()
    assert child.wait(timeout=10) == -9  # SIGKILL from the kernel when the thread ended
