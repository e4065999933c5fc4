"""Run the gateway under uvicorn on a socket we bind ourselves (so port 0 works and the port can be reported)."""

from __future__ import annotations

import os
import signal
import socket
import sys

import uvicorn

from cache.contract.runtime_http import READY_PREFIX
from gateway.app import create_app
from gateway.protocol import timed_httptools
from gateway.settings import GatewaySettings

BACKLOG = 2048  # uvicorn's own default


def serve(settings: GatewaySettings, *, ready_line: bool = True, log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM; prints `READY <port>` on stdout once requests are accepted."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this on Linux: without it a response written as headers + body waits for the
    # peer's delayed ACK (~40 ms per call).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((settings.host, settings.port))
    # Listening before the announcement: uvicorn runs the app's startup (which announces READY) before it listens,
    # and a client connecting in between was refused (a restarted gateway's first call, on a loaded machine).
    # Connections that arrive early wait in the backlog until uvicorn accepts them.
    sock.listen(BACKLOG)
    port = sock.getsockname()[1]

    def ready() -> None:
        print(f"{READY_PREFIX}{port}", flush=True)  # the same announcement as a function runtime's
        # Nothing else goes to stdout: a spawner may stop reading it, and a full pipe would block the gateway.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    app = create_app(settings, on_ready=ready if ready_line else None)

    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, timeout_graceful_shutdown=30, backlog=BACKLOG,
        http=timed_httptools(settings.header_timeout_s),
    )  # fmt: skip
    server = uvicorn.Server(config)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run(sockets=[sock])
    sys.stdout.flush()
