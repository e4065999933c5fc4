"""Run the gateway under uvicorn on a socket we bind ourselves (so port 0 works and the port can be reported)."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import socket
import sys

import uvicorn

from contract.runtime_http import READY_PREFIX
from gateway.app import create_app
from gateway.protocol import timed_httptools
from gateway.settings import GatewaySettings

BACKLOG = 2048  # uvicorn's own default
FALLBACK_S = 5.0  # how late a stop's report may come from a blocked event loop before faulthandler's thread writes it


class _Server(uvicorn.Server):
    """A stop still under way `report_s` after it began prints every thread's stack and every pending task's to
    stderr: a gateway that outlives its SIGTERM (seen twice in CI, over 30 s, never reproduced here) then says
    where it waits."""

    def __init__(self, config: uvicorn.Config, report_s: float) -> None:
        super().__init__(config)
        self.report_s = report_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The event loop writes both reports, one after the other (two writers at once interleave their lines), and
        # cancels faulthandler's timer; a loop too blocked to do so by `report_s + FALLBACK_S` leaves the threads'
        # stacks to faulthandler's own thread. A stop that ends sooner needs no cancel: the process is gone.
        faulthandler.dump_traceback_later(self.report_s + FALLBACK_S, exit=False)
        report = asyncio.ensure_future(self._report())
        try:
            await super().shutdown(sockets)
        finally:
            report.cancel()

    async def _report(self) -> None:
        await asyncio.sleep(self.report_s)
        faulthandler.cancel_dump_traceback_later()
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.print_stack(file=sys.stderr)
        sys.stderr.flush()


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
        app,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        backlog=BACKLOG,
        http=timed_httptools(settings.header_timeout_s),
    )
    server = _Server(config, settings.stop_report_s)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run(sockets=[sock])
    sys.stdout.flush()
