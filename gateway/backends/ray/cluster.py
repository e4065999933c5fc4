"""A private Ray cluster on this machine, owned by this process: `ray start --block` nodes started and stopped by PID.

Used by the ray backend when no cluster address is given (a private head, like the embedded Redis), by
`stellaris train --backend ray`, and by the tests (several nodes on loopback addresses, one per node: 127.0.0.2,
127.0.0.3, ...; Ray rewrites 127.0.0.1 to the machine's address, other loopback addresses it keeps).

    cluster = LocalRayCluster()                       # a private temp dir under /tmp
    head = cluster.start_head(node_ip="127.0.0.2", num_cpus=2, resources={"cpu_node": 1})
    gpu = cluster.add_node(node_ip="127.0.0.3", num_cpus=1, num_gpus=1, resources={"gpu_node": 1})
    ray.init(address=cluster.address)                 # a driver on this machine
    cluster.kill_node(gpu)                            # SIGKILL that node's whole process tree (a lost machine)
    cluster.stop()                                    # SIGTERM every node, then SIGKILL whatever is left

Never `ray stop` (it kills every Ray process of the machine, other users' too). No node outlives its owner, even
after a kill -9: each node is a `ray start --block` process in its own session that dies with the thread that
started it (PR_SET_PDEATHSIG; the cluster starts nodes from one thread of its own, which lives until stop()); Ray
makes the GCS and raylet share that fate, but not the raylet's agents, so a watchdog process (SessionWatchdog) kills
whatever is left in the nodes' sessions once the owner is gone. Each start waits for the node's "Ray runtime
started." line, which `ray start` prints once the node is registered in the GCS; every wait is bounded.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from contract.instance_env import INHERITED_ENV, RAY_ENV, inherited_env
from gateway.backends.process.tree import (
    SessionWatchdog,
    SpawnThread,
    alive,
    descendants,
    kill_all,
    pids_naming,
    session_members,
    wait_gone,
)
from host.lifetime import dies_with_us

READY_LINE = "Ray runtime started."
# Ray reads RAY_<system config> from its processes' environment (`ray start` has no --system-config): a lost node is
# declared dead after ~2 s rather than ~17 s, so its actors fail fast and our pools replace them.
FAST_FAILURE_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "1000",
}
NODE_ENV = {
    # Stated rather than left to Ray: with RAY_AUTH_MODE unset, a head turns token authentication on when it finds a
    # ~/.ray/auth_token (any local `ray.init()` writes one), and the nodes joining it then fail to connect.
    "RAY_AUTH_MODE": "disabled",
    # On SIGTERM a node otherwise waits up to 30 s for its actors to leave (a drain meant for Ray Serve); our pools
    # drain their instances themselves before a cluster stops.
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}
LOG_TAIL_LINES = 40


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RayClusterError(RuntimeError):
    """A node did not start, or the cluster was used in the wrong order."""


@dataclass
class RayNode:
    """One `ray start --block` process and what it declared."""

    ip: str
    head: bool
    proc: subprocess.Popen[str]
    num_cpus: int
    num_gpus: int
    resources: dict[str, float]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    ready: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        return "\n".join(self.tail) or "(no output)"


class LocalRayCluster:
    """Ray nodes on this machine, started and stopped by PID. `temp_dir`: Ray's root temp dir (None: a private one
    under /tmp, removed by stop(); keep it short, Ray puts unix sockets in it). `env`: added to the nodes'
    environment (and so to every actor's). `fast_failure_detection`: FAST_FAILURE_ENV. Starts wait up to
    `start_timeout_s`; stop() gives each node `stop_timeout_s` to exit after SIGTERM before SIGKILL."""

    def __init__(
        self,
        temp_dir: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        *,
        fast_failure_detection: bool = True,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        inherit_env: Sequence[str] = INHERITED_ENV,
    ) -> None:
        self._own_temp_dir = temp_dir is None
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="ray-", dir="/tmp")).resolve()
        # Ray's own variables and the allowed part of ours, never our credentials: every actor's process inherits it.
        self.env = {**inherited_env(os.environ, (*inherit_env, RAY_ENV)), **NODE_ENV, **(env or {})}
        if fast_failure_detection:
            self.env = {**FAST_FAILURE_ENV, **self.env}
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.nodes: list[RayNode] = []
        self.head: RayNode | None = None
        self.port: int | None = None
        self._spawner: SpawnThread | None = None
        self._watchdog: SessionWatchdog | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """host:port of the head's GCS: what `ray.init(address=...)` and `ray start --address` take."""
        if self.head is None or self.port is None:
            raise RayClusterError("the cluster has no head yet: call start_head() first")
        return f"{self.head.ip}:{self.port}"

    def start_head(
        self,
        *,
        node_ip: str = "127.0.0.2",
        num_cpus: int | None = None,
        num_gpus: int = 0,
        resources: Mapping[str, float] | None = None,
        object_store_memory_bytes: int = 200_000_000,
    ) -> RayNode:
        """The head (GCS) and its raylet. num_cpus None: the CPUs this process may use."""
        if self.head is not None:
            raise RayClusterError(f"the cluster already has a head at {self.address}")
        cpus = num_cpus if num_cpus is not None else len(os.sched_getaffinity(0))
        self.port = free_port(node_ip)
        args = ["--head", "--port", str(self.port), "--include-dashboard=false", "--temp-dir", str(self.temp_dir)]
        self.head = self._start(True, node_ip, cpus, num_gpus, resources, object_store_memory_bytes, args)
        return self.head

    def add_node(
        self,
        *,
        node_ip: str,
        num_cpus: int = 1,
        num_gpus: int = 0,
        resources: Mapping[str, float] | None = None,
        object_store_memory_bytes: int = 100_000_000,
    ) -> RayNode:
        """A worker node joining the head (it shares the head's temp dir)."""
        args = ["--address", self.address]
        return self._start(False, node_ip, num_cpus, num_gpus, resources, object_store_memory_bytes, args)

    def _start(
        self,
        head: bool,
        node_ip: str,
        num_cpus: int,
        num_gpus: int,
        resources: Mapping[str, float] | None,
        object_store_memory_bytes: int,
        args: list[str],
    ) -> RayNode:
        what = f"Ray {'head' if head else 'node'} on {node_ip}"
        if num_cpus < 0 or num_gpus < 0:
            raise RayClusterError(f"{what}: num_cpus {num_cpus} and num_gpus {num_gpus} must be >= 0")
        cmd = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            *args,
            "--node-ip-address",
            node_ip,
            "--num-cpus",
            str(num_cpus),
            "--num-gpus",
            str(num_gpus),
            "--resources",
            json.dumps(dict(resources or {})),
            "--object-store-memory",
            str(object_store_memory_bytes),
            "--disable-usage-stats",
        ]
        with self._lock:
            if self._spawner is None or self._watchdog is None:
                self._spawner, self._watchdog = SpawnThread(), SessionWatchdog(self.stop_timeout_s)
            spawner, watchdog = self._spawner, self._watchdog
        proc = spawner.run(
            lambda: subprocess.Popen(
                cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=dies_with_us(),
            )
        )
        watchdog.watch(proc.pid)  # its session: die_with_parent made `ray start` a session leader
        node = RayNode(node_ip, head, proc, num_cpus, num_gpus, dict(resources or {}))
        with self._lock:
            self.nodes.append(node)
        threading.Thread(target=self._read, args=(node,), name=f"ray-node-{node_ip}", daemon=True).start()
        # The reader sets `ready` on the ready line and also when the output ends (the node exited): one event.
        if not node.ready.wait(self.start_timeout_s) or node.ended.is_set():
            reason = "exited" if node.ended.is_set() else f"not ready within {self.start_timeout_s:g} s"
            self._kill_node_tree(node)
            raise RayClusterError(f"{what} {reason}; its last output:\n{node.log_tail()}")
        return node

    @staticmethod
    def _read(node: RayNode) -> None:
        """Drain the node's output (so it never blocks on a full pipe), keep its tail, flag the ready line."""
        assert node.proc.stdout is not None
        for line in node.proc.stdout:
            node.tail.append(line.rstrip())
            if READY_LINE in line:
                node.ready.set()
        node.ended.set()
        node.ready.set()  # wakes a start() still waiting, which then sees `ended`

    def pids(self) -> set[int]:
        """Every live process of this cluster: the nodes' `ray start` processes, their descendants, and anything
        naming the private temp dir (Ray renames its workers `ray::...`, so the trees are what finds those)."""
        with self._lock:
            nodes = list(self.nodes)
        return self._processes(nodes)

    def _processes(self, nodes: list[RayNode]) -> set[int]:
        found = {n.pid for n in nodes if n.proc.poll() is None} | session_members({n.pid for n in nodes})
        for node in nodes:
            found |= descendants(node.pid)
        return found | pids_naming(f"{self.temp_dir}{os.sep}")

    def kill_node(self, node: RayNode) -> None:
        """SIGKILL the node's whole process tree at once, as a lost machine: Ray sees the node die (fast with
        fast_failure_detection) and fails its actors."""
        self._kill_node_tree(node)
        with self._lock:
            if node in self.nodes:
                self.nodes.remove(node)

    def _kill_node_tree(self, node: RayNode) -> None:
        tree = {node.pid} | descendants(node.pid) | session_members({node.pid})
        kill_all(tree)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=self.stop_timeout_s)
        if not wait_gone(tree, self.stop_timeout_s) and self._watchdog is not None:
            self._watchdog.forget(node.pid)

    def stop(self) -> None:
        """SIGTERM every node (workers first, then the head), wait for each, then SIGKILL what is left of their
        trees and any process naming the temp dir. Idempotent."""
        with self._lock:
            nodes, self.nodes = list(self.nodes), []
        before = self._processes(nodes)  # taken before SIGTERM, while every process still has its parent
        for node in sorted(nodes, key=lambda n: n.head):
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=self.stop_timeout_s)
        leftovers = before
        for _ in range(3):  # a raylet may have forked a worker meanwhile: look again until none is found
            leftovers = {p for p in leftovers if alive(p)} | self._processes(nodes)
            if not leftovers:
                break
            kill_all(leftovers)
            wait_gone(leftovers, self.stop_timeout_s)
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()
            if node.proc.stdout is not None:
                node.proc.stdout.close()
        self.head, self.port = None, None
        if self._spawner is not None and self._watchdog is not None:
            self._spawner.close()
            self._watchdog.close()
            self._spawner, self._watchdog = None, None
        if self._own_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
