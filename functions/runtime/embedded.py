"""The runtime embedded in a host process that is not ours to own, such as a Ray actor: `start_embedded` serves one
handler from a thread of its own and returns once connections are accepted. The gateway's Ray actor reaches this
entry by name (EMBEDDED_RUNTIME in contract/runtime_http.py), never by import."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from dataclasses import dataclass

from functions.runtime.call_log import configure_logging
from functions.runtime.cli import LOG_LEVEL_ENV
from functions.runtime.server import RESPONSE_FLUSH_S, Runtime
from functions.runtime.settings import RuntimeSettings

log = logging.getLogger("stellaris.runtime")


@dataclass
class EmbeddedRuntime:
    """A runtime serving on `port` from `thread`."""

    runtime: Runtime
    port: int
    thread: threading.Thread
    exit_codes: queue.Queue[int]

    def stop(self, timeout_s: float) -> bool:
        """Drain: new calls get 503, running ones may finish within `timeout_s`, then the drain is cut short.
        True when every call finished."""
        self.runtime.stop()
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.runtime.stop()  # a second stop ends the drain now
            self.thread.join(RESPONSE_FLUSH_S + 1.0)
        try:
            return self.exit_codes.get_nowait() == 0 and not self.thread.is_alive()
        except queue.Empty:
            return False


def start_embedded(
    handler: str,
    *,
    host: str,
    port: int = 0,
    concurrency: int = 1,
    timeout_s: float = 60.0,
    ready_timeout_s: float = 60.0,
) -> EmbeddedRuntime:
    """Serve `handler` (module:function) on host:port (port 0: a free one; any host, remote callers allowed) and
    return once it accepts connections. The secret comes from SECRET_ENV, as for a runtime process. Raises what
    loading the handler raised, OSError when the port cannot be bound, TimeoutError past `ready_timeout_s`."""
    settings = RuntimeSettings(
        handler=handler, host=host, port=port, concurrency=concurrency, timeout_s=timeout_s, allow_remote=True
    )
    configure_logging(os.environ.get(LOG_LEVEL_ENV, "INFO"))
    runtime = Runtime(settings)  # loads the handler here, so that a bad one raises in the caller
    ports: queue.Queue[int | Exception] = queue.Queue()
    exit_codes: queue.Queue[int] = queue.Queue()

    def serve() -> None:
        try:
            exit_codes.put(asyncio.run(runtime.run(on_ready=ports.put)))
        except Exception as exc:  # the port could not be bound: the waiting caller raises it
            ports.put(exc)

    thread = threading.Thread(target=serve, name="stellaris-runtime", daemon=True)
    thread.start()
    try:
        ready = ports.get(timeout=ready_timeout_s)
    except queue.Empty:
        runtime.stop()
        raise TimeoutError(f"the runtime of {handler} did not serve on {host} within {ready_timeout_s:g} s") from None
    if isinstance(ready, Exception):
        raise ready
    log.info("embedded runtime of %s serving on %s:%d", handler, host, ready)
    return EmbeddedRuntime(runtime, ready, thread, exit_codes)
