"""A private Ray: what `stellaris train --backend ray` gets without an address. A gateway with no Ray address starts
its own head on first use and stops it when it stops, instances included; a local cluster's nodes die with their
owner even when it is killed with SIGKILL; killing a node (a lost machine) kills its whole tree. All checked by
PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from gateway.backends.process.tree import alive, descendants
from gateway.backends.ray.cluster import LocalRayCluster
from gateway.models import FunctionSpec, Resources
from tests.gateway.conftest import ROOT, start_gateway, stop_gateway
from tests.procs import wait_pid_gone

pytestmark = pytest.mark.cluster  # starts Ray clusters: CI's long stage (make test-long, .ci/long-stage.sh)

H = "tests.gateway.identity_handlers"
PREFIXES = json.dumps(["functions.handlers.", "tests.gateway."])


def test_a_gateway_without_a_ray_address_runs_a_private_ray_and_stops_it(redis_server) -> None:
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_TARGET_PREFIXES=PREFIXES)
    ray_pids: set[int] = set()
    try:
        with gw.client() as c:
            c.register(FunctionSpec(name="solo", backend="ray", target=f"{H}:red", resources=Resources(cpus=0.5)))
            result, meter = c.invoke_metered("solo", {})
            assert meter.node == "127.0.0.2" and meter.cold is True  # the private head's address
            ray_pids = descendants(gw.proc.pid)
            assert result["pid"] in ray_pids  # the instance is a process of the gateway's own Ray
            assert c.invoke("solo", {})["calls"] == 2
    finally:
        stop_gateway(gw)
    assert len(ray_pids) > 3  # ray start, its GCS, raylet, ... and the actor's worker
    assert not [pid for pid in ray_pids if alive(pid)], "processes of the private Ray outlived its gateway"


OWNER = """
import sys
from gateway.backends.ray.cluster import LocalRayCluster
cluster = LocalRayCluster()
cluster.start_head(num_cpus=1)
print(cluster.temp_dir, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_a_local_clusters_nodes_die_with_their_owner_killed_by_sigkill() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    temp_dir = ""
    try:
        assert owner.stdout is not None
        temp_dir = owner.stdout.readline().strip()
        assert temp_dir, "the owner did not start its head"
        ray_pids = descendants(owner.pid)
        assert len(ray_pids) > 3
        os.kill(owner.pid, signal.SIGKILL)  # no stop(), no atexit: only the kernel's PR_SET_PDEATHSIG and Ray's
        owner.wait(timeout=30)
        assert all(wait_pid_gone(pid, 30) for pid in ray_pids), [pid for pid in ray_pids if alive(pid)]
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if temp_dir.startswith("/tmp/ray-"):
            shutil.rmtree(temp_dir, ignore_errors=True)  # its owner, killed, could not remove it


def test_killing_a_node_kills_its_whole_tree_and_stop_leaves_nothing() -> None:
    cluster = LocalRayCluster()
    try:
        head = cluster.start_head(num_cpus=1)
        tree = {head.pid} | descendants(head.pid)
        assert cluster.pids() >= tree and len(tree) > 3
        cluster.kill_node(head)  # as a lost machine: SIGKILL, no drain
        assert not [pid for pid in tree if alive(pid)]
        assert cluster.nodes == [] and cluster.pids() == set()
    finally:
        cluster.stop()
    assert not cluster.temp_dir.exists()
