"""Process backend (the embedded default): each instance is a real process running the function runtime on a
loopback port, with CPU affinity and a data-segment memory limit where the OS allows. Instances are forked from a
fork server that has the runtime and their handler imported (gateway/backends/process/zygote.py), or started as a fresh
`python -m functions.runtime` where no fork server serves their environment (`fork_servers`; 0: none). Instances
die with the gateway (PR_SET_PDEATHSIG), so none outlives it."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cache.acl import url_without_credentials
from cache.connection import REDIS_URL_ENV
from contract.instance_env import INHERITED_ENV, inherited_env
from contract.runtime_http import READY_PREFIX, RUNTIME_MODULE, runtime_argv
from contract.zygote import SpawnRequest
from gateway.backends.base import BackendError, InstanceHandle
from gateway.backends.process.core_placement import CorePlacement
from gateway.backends.process.fork_servers import STARTUP_TIMEOUT_S, ForkServers
from gateway.backends.process.zygote import ForkedProcess, ForkServerError, first_line
from gateway.models import FunctionSpec
from host.lifetime import die_with_parent, stop_process

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

log = logging.getLogger("stellaris.gateway")
Process = subprocess.Popen[bytes] | ForkedProcess


def _preexec(memory_bytes: int) -> Callable[[], None]:
    gateway = os.getpid()

    def setup() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
        die_with_parent(gateway)  # and a terminal's Ctrl-C reaches the gateway, which drains its instances

    return setup


def instances_base_env(
    parent: Mapping[str, str], inherit: Sequence[str], extra: Mapping[str, str], redis_url: str | None
) -> dict[str, str]:
    """What every instance's environment starts from (its fork server's too): the variables of the gateway's
    environment `inherit` allows, less every secret (contract/instance_env.py), `extra`, and the cache's
    address without the deployment's credentials (a registration brings its job's own Redis user)."""
    env = {**inherited_env(parent, inherit), **extra}
    if redis_url:
        env[REDIS_URL_ENV] = url_without_credentials(redis_url)
    return env


def from_settings(settings: GatewaySettings, redis_url: str | None) -> ProcessBackend:
    """The gateway's process backend (gateway/backends/registry.py)."""
    return ProcessBackend(
        redis_url=redis_url,
        inherit_env=settings.instance_env_inherit,
        fork_servers=settings.fork_servers,
        fork_server_retry_s=settings.fork_server_retry_s,
    )


class ProcessBackend:
    name = "process"

    def __init__(
        self,
        *,
        python: str = sys.executable,
        cwd: str | Path | None = None,
        redis_url: str | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        extra_env: dict[str, str] | None = None,
        fork_servers: int = 2,
        fork_server_retry_s: float = 10.0,
        inherit_env: Sequence[str] = INHERITED_ENV,
    ) -> None:
        self.python = python
        self.cwd = str(cwd) if cwd else None
        self.redis_url = redis_url
        self.inherit_env = tuple(inherit_env)
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = extra_env or {}
        self.forks: ForkServers | None = None
        if fork_servers > 0:
            self.forks = ForkServers(
                python, self.cwd, self._env({}), startup_timeout_s, fork_servers, retry_s=fork_server_retry_s
            )
        self._procs: dict[str, Process] = {}
        self._lock = threading.Lock()
        try:
            self._placement: CorePlacement | None = CorePlacement(sorted(os.sched_getaffinity(0)))
        except (AttributeError, OSError):  # no affinity on this OS: instances are not pinned
            self._placement = None

    def calling(self, handle: InstanceHandle) -> None:
        """A call is about to run on the instance: at its first, pin every thread of it to the cores
        gateway/backends/process/core_placement.py chooses."""
        if self._placement is None:
            return
        with self._lock:
            cores = self._placement.first_call(handle.id)
        if cores is not None and handle.pid is not None:
            with contextlib.suppress(OSError):  # gone meanwhile: its call fails on its own
                for tid in os.listdir(f"/proc/{handle.pid}/task"):
                    os.sched_setaffinity(int(tid), cores)

    def start(self, spec: FunctionSpec, *, instance_id: str) -> InstanceHandle:
        if not spec.target:
            raise BackendError(f"function {spec.name!r} has no target for the process backend")
        argv = runtime_argv(spec.target, port=0, concurrency=spec.concurrency_per_instance, timeout_s=spec.timeout_s)
        cmd = [self.python, "-m", RUNTIME_MODULE, *argv]
        env = self._env({**spec.env, "STELLARIS_INSTANCE_ID": instance_id})
        started = time.monotonic()
        proc = self._fork(cmd, env, spec) or subprocess.Popen(
            cmd,
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=_preexec(spec.resources.memory_bytes),  # PDEATHSIG has no Popen argument
        )
        port = self._wait_ready(proc, spec)
        with self._lock:
            self._procs[instance_id] = proc
            if self._placement is not None:
                self._placement.add(instance_id, max(1, int(spec.resources.cpus)))
        return InstanceHandle(
            id=instance_id,
            function=spec.name,
            url=f"http://127.0.0.1:{port}",
            backend=self.name,
            pid=proc.pid,
            init_s=time.monotonic() - started,
            spec_digest=spec.digest(),
        )

    def _env(self, own: dict[str, str]) -> dict[str, str]:
        return {**instances_base_env(os.environ, self.inherit_env, self.extra_env, self.redis_url), **own}

    def _fork(self, cmd: list[str], env: dict[str, str], spec: FunctionSpec) -> ForkedProcess | None:
        """The instance forked from the fork server for its environment; None where it must start the usual way
        (fork servers are off, all `fork_servers` serve other environments, or its server cannot start)."""
        server = self.forks.for_env(spec.env) if self.forks is not None else None
        if server is None or server.failed:
            return None
        request = SpawnRequest(
            module=RUNTIME_MODULE,
            argv=cmd[3:],
            env=env,
            cwd=self.cwd,
            memory_bytes=spec.resources.memory_bytes,
            title=" ".join(cmd),
        )
        try:
            return server.spawn(request)
        except ForkServerError as exc:
            log.warning("starting an instance of %r without the fork server: %s", spec.name, exc)
            return None

    def start_soon(self, env: dict[str, str] | None = None) -> None:
        """Start the fork server for registrations that set `env` in the background, ready for their first
        instance (no-op without fork servers)."""
        server = self.forks.for_env(env or {}) if self.forks is not None else None
        if server is not None:
            server.start_soon()

    def close(self) -> None:
        """Stop the fork server (instances are stopped by their pools first; any left die with it)."""
        if self.forks is not None:
            self.forks.close()

    def _wait_ready(self, proc: Process, spec: FunctionSpec) -> int:
        """Block on the runtime's `READY <port>` line (an event, not a poll), bounded by startup_timeout_s."""
        assert proc.stdout is not None
        line = first_line(proc.stdout, self.startup_timeout_s)
        if line is not None and line.startswith(READY_PREFIX):
            return int(line.removeprefix(READY_PREFIX))
        proc.kill()
        code = proc.wait()
        reason = f"exited with code {code}" if line is not None else f"not ready within {self.startup_timeout_s:.0f} s"
        raise BackendError(f"instance of {spec.name!r} ({spec.target}) {reason}; see the gateway's stderr")

    def alive(self, handle: InstanceHandle) -> bool:
        proc = self._procs.get(handle.id)
        return proc is not None and proc.poll() is None

    def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        with self._lock:
            proc = self._procs.pop(handle.id, None)
            if self._placement is not None:
                self._placement.forget(handle.id)
        if proc is None:
            return
        stop_process(proc, timeout_s)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self, handle: InstanceHandle) -> None:
        """SIGKILL without draining (used when an instance must go at once, e.g. a stuck handler)."""
        proc = self._procs.get(handle.id)
        if proc is not None and proc.poll() is None:
            proc.kill()

    def discover(self) -> list[InstanceHandle]:
        return []  # process instances never outlive the gateway that started them
