"""The process backend's fork servers, one per load-time environment (gateway/backends/process/zygote.py `ForkServer`),
and
the one `python -m gateway` starts before its own imports, for the backend to adopt."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from contract.zygote import load_time_changes
from gateway.backends.process.zygote import ForkServer

log = logging.getLogger("stellaris.gateway")
STARTUP_TIMEOUT_S = 60.0  # the process backend's default wait for a fork server's or an instance's READY line


def _flavour(base_env: Mapping[str, str], own: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What chooses the server for a registration that sets `own`: the values it gives the load-time variables. The
    gateway's own environment is the server's (give or take what changed in it since the server started, as for any
    process started before the change)."""
    return tuple(sorted((k, own[k]) for k in load_time_changes({**base_env, **own}, base_env)))


# A server started before the gateway's own imports (`start_early`), until the backend's first ask adopts it.
_early: list[ForkServer] = []


def start_early(
    python: str, base_env: Mapping[str, str], own: Mapping[str, str], startup_timeout_s: float, retry_s: float
) -> ForkServer:
    """Start, in the background, the server a process backend with `base_env` would start for registrations that
    set `own`: its imports (the function runtime's: torch, gymnasium) then overlap the gateway's own, which take
    as long again, and a new gateway's first instance waits less (`python -m gateway` calls this first thing)."""
    server = ForkServer(python, None, {**base_env, **dict(_flavour(base_env, own))}, startup_timeout_s, retry_s=retry_s)
    server.start_soon()
    _early.append(server)
    return server


def _adopt_early(python: str, cwd: str | None, env: Mapping[str, str]) -> ForkServer | None:
    """The server started early, when it is the one asked for (same interpreter, directory and environment); one
    that is not is stopped (nothing would ever ask for it)."""
    while _early:
        server = _early.pop()
        if (server.python, server.cwd, server.env) == (python, cwd, dict(env)):
            return server
        log.warning("the fork server started early has another environment than the backend's: stopped")
        server.close()
    return None


class ForkServers:
    """The backend's fork servers, one per load-time environment: the values a registration's env gives the
    variables a fork would not honour (`load_time_changes`; OMP_NUM_THREADS=1, say) choose the server, which is
    started with them. At most `limit` servers (each holds its imports, a few hundred MB shared with its
    instances); an instance that would need one more starts as a fresh interpreter."""

    def __init__(
        self,
        python: str,
        cwd: str | None,
        base_env: Mapping[str, str],
        startup_timeout_s: float,
        limit: int,
        retry_s: float = 10.0,
    ) -> None:
        self.python, self.cwd, self.base_env = python, cwd, dict(base_env)
        self.startup_timeout_s, self.limit, self.retry_s = startup_timeout_s, limit, retry_s
        self.servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}
        self._lock = threading.Lock()

    def for_env(self, own: Mapping[str, str]) -> ForkServer | None:
        """The server for instances whose registration sets `own`; None when `limit` servers serve others."""
        flavour = _flavour(self.base_env, own)
        with self._lock:
            server = self.servers.get(flavour)
            if server is None and len(self.servers) < self.limit:
                env = {**self.base_env, **dict(flavour)}
                server = _adopt_early(self.python, self.cwd, env) or ForkServer(
                    self.python, self.cwd, env, self.startup_timeout_s, retry_s=self.retry_s
                )
                self.servers[flavour] = server
        return server

    def close(self) -> None:
        with self._lock:
            servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()
