"""`stellaris train --backend ray` end to end on a real multi-node Ray cluster on loopback: a CPU node (the head, on
127.0.0.2, declaring `cpu_node`) and a node that declares one GPU and `gpu_node` (127.0.0.3). The real CLI drives a
local gateway whose ray backend starts every learner, parameter and serverless actor function as a Ray actor.

Where each function ran is read twice: from the activation records (invocations.csv's `node`) and from Ray's own
actor table (the GCS's record of each actor's node). The cluster's processes are ours, stopped and checked by PID;
`ray stop` is never used (it kills every Ray on the machine). These tests start clusters: they carry the `cluster`
marker and run in CI's long stage (make test-long, .ci/long-stage.sh)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import yaml

from cache import Cache
from gateway.backends.process.tree import descendants
from gateway.backends.ray.cluster import LocalRayCluster, RayNode
from tests.gateway.conftest import TOKEN, start_gateway, stop_gateway
from tests.procs import pid_alive
from tests.stellaris.test_isolation import (
    INVOKE_TOKEN,
    PROBE_ENV,
    assert_nothing_got_through,
    probe_reports,
    victim_job,
)
from tests.stellaris.test_train import (
    FAST_CARTPOLE,
    ROOT,
    check_each_task_applied_once,
    check_outputs,
    mean_reward,
    read_on,
    rows,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HEAD_IP, GPU_IP, SPARE_GPU_IP = "127.0.0.2", "127.0.0.3", "127.0.0.4"
GPU_NODE = {"num_cpus": 4, "num_gpus": 1, "resources": {"gpu_node": 100}}
PLACEMENT = [
    "--backend",
    "ray",
    "--actor-kind",
    "serverless",
    "--device",
    "cpu",
    "--learner-gpus",
    "0.25",
    "--parameter-gpus",
    "0.25",
    "--learner-resources",
    "gpu_node=1",
    "--parameter-resources",
    "gpu_node=1",
    "--actor-resources",
    "cpu_node=1",
]


# A credential the nodes' environment holds (a cluster's operator set it): no instance may see it.
NODE_SECRET = {"STELLARIS_GATEWAY_TOKEN": "a-token-the-ray-nodes-hold"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    cluster = LocalRayCluster(env=NODE_SECRET)
    try:
        cluster.start_head(node_ip=HEAD_IP, num_cpus=4, resources={"cpu_node": 100})
        cluster.add_node(node_ip=GPU_IP, **GPU_NODE)
        ray.init(address=cluster.address, namespace="stellaris-tests", logging_level="ERROR", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        pids = cluster.pids()
        cluster.stop()
        left = [pid for pid in pids if pid_alive(pid)]
        assert not left, f"Ray processes {left} outlived the cluster's stop"


def ray_train(tmp_path: Path, cluster: LocalRayCluster, *args: str) -> list[str]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(FAST_CARTPOLE))
    return [
        sys.executable,
        "-m",
        "stellaris.cli",
        "train",
        "--config",
        str(config),
        *PLACEMENT,
        "--ray-address",
        cluster.address,
        *args,
    ]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}


def actor_nodes(job_prefix: str) -> dict[str, set[str]]:
    """Role -> the node addresses Ray's actor table gives for the job's function instances (named
    `<job>-<role>-<id>`), dead ones included: the GCS keeps destroyed actors' records."""
    from ray._private import state

    nodes: dict[str, set[str]] = {}
    for actor in state.actors().values():
        name = actor.get("Name") or ""
        if name.startswith(job_prefix):
            role = name.removeprefix(job_prefix).split("-", 1)[0]
            nodes.setdefault(role, set()).add(actor["Address"]["IPAddress"])
    return nodes


def job_prefix(out: Path) -> str:
    """`<job id>-`: the run's function names, as invocations.csv has them."""
    function = rows(out / "invocations.csv")[0]["function"]
    return function.rsplit("-", 1)[0] + "-"


def test_train_learns_cartpole_with_learners_on_the_gpu_node_and_actors_on_the_cpu_node(
    tmp_path: Path, cluster: LocalRayCluster
) -> None:
    out = tmp_path / "run"
    cmd = ray_train(tmp_path, cluster, "--rounds", "60", "--out", str(out))
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = check_outputs(out, serverless=True)
    assert [int(r["round_id"]) for r in info] == list(range(1, 61))
    first, best_late = mean_reward(info[0]), max(mean_reward(r) for r in info[-10:])
    print(f"ray: round 1 mean return {first:.1f}, best of the last 10 rounds {best_late:.1f}")
    assert best_late >= max(100.0, 3 * first)  # the process-backend test's threshold (test_train.py)

    # The activation records: each call ran on the node its function's resources pick.
    ran_on: dict[str, set[str]] = {}
    for r in rows(out / "invocations.csv"):
        if r["node"]:
            ran_on.setdefault(r["function"].rsplit("-", 1)[1], set()).add(r["node"])
    assert ran_on == {"learner": {GPU_IP}, "parameter": {GPU_IP}, "actor": {HEAD_IP}}, ran_on
    # Ray's own record of where it placed each instance says the same.
    assert actor_nodes(job_prefix(out)) == {"learner": {GPU_IP}, "parameter": {GPU_IP}, "actor": {HEAD_IP}}


def test_a_job_survives_losing_the_gpu_node_and_applies_every_task_once(
    tmp_path: Path, cluster: LocalRayCluster
) -> None:
    spare: RayNode = cluster.add_node(node_ip=SPARE_GPU_IP, **GPU_NODE)  # where the lost node's functions go
    out, rounds = tmp_path / "run", 8
    cmd = ray_train(tmp_path, cluster, "--rounds", str(rounds), "--out", str(out))
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=clean_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    assert proc.stderr is not None
    victim = next(n for n in cluster.nodes if n.ip == GPU_IP)
    victims = {victim.pid, *descendants(victim.pid)}
    for line in proc.stderr:  # the per-round log line is the event we wait for
        if line.startswith("round 3 "):
            break
    cluster.kill_node(victim)  # SIGKILL of the node's raylet, agents and every actor process on it
    lines, reader = read_on(proc)
    try:
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    reader.join(timeout=10)
    assert code == 0, "".join(lines)[-3000:]
    assert not [pid for pid in victims if pid_alive(pid)]
    info = rows(out / "info.csv")
    assert [int(r["round_id"]) for r in info] == list(range(1, rounds + 1))
    check_each_task_applied_once(out, rounds)
    # Learners after the loss ran on the spare GPU node (and never on the CPU node).
    nodes = {r["node"] for r in rows(out / "invocations.csv") if r["function"].endswith("-learner") and r["node"]}
    assert spare.ip in nodes and HEAD_IP not in nodes, nodes


def test_code_in_a_ray_job_reaches_nothing_outside_it(
    tmp_path: Path, cluster: LocalRayCluster, redis_server, cache_conn: Cache
) -> None:
    """tests/stellaris/test_isolation.py's probe, made inside the job's Ray actors (learner, parameter and serverless
    actor) on a given cluster whose nodes hold a token: nothing in their environment reaches another job's keys, the
    keyspace or the gateway, and the nodes' token is not theirs."""
    victim, theirs = victim_job(cache_conn)
    gw = start_gateway(
        redis_server.url, STELLARIS_GATEWAY_RAY_ADDRESS=cluster.address, STELLARIS_GATEWAY_INVOKE_TOKEN=INVOKE_TOKEN
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({**FAST_CARTPOLE, "env": PROBE_ENV, "env_kwargs": {"victim": victim, "gateway_url": gw.url}})
    )
    cmd = [
        sys.executable,
        "-m",
        "stellaris.cli",
        "train",
        "--config",
        str(config),
        "--backend",
        "ray",
        "--actor-kind",
        "serverless",
        "--device",
        "cpu",
        "--gateway-url",
        gw.url,
        "--gateway-token",
        TOKEN,
        "--redis-url",
        redis_server.url,
        "--rounds",
        "2",
        "--out",
        str(tmp_path / "run"),
    ]
    try:
        with probe_reports(cache_conn.client) as reports:
            proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        secrets = [TOKEN, INVOKE_TOKEN, redis_server.password, *NODE_SECRET.values()]
        assert_nothing_got_through(reports, secrets, {"learner", "parameter", "actor"}, theirs)
    finally:
        stop_gateway(gw)
        theirs.delete()
