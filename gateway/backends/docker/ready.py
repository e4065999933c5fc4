"""When a started container is ready: its runtime printed `READY <port>` (read from the log stream, event-driven)
and answers GET /health through the address the gateway will use. Every wait is bounded by a deadline; a container
that exits or misses it becomes a BackendError carrying its last log lines."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

import httpx
import requests
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from contract.runtime_http import HEALTH_PATH, READY_PREFIX
from gateway.backends.base import BackendError

LOG_TAIL_LINES = 20
log = logging.getLogger("stellaris.gateway.docker")


def wait_ready(container: Container, what: str, deadline: float, ready_timeout_s: float) -> None:
    """Block until the runtime prints READY, the container exits, or the deadline passes.

    The log stream is opened and read on a helper thread: some engines (podman) answer the request only once the
    first line is out. On timeout the stream is closed, or the container's removal ends it.
    """
    outcome: queue.Queue[str] = queue.Queue(maxsize=1)
    streams: list[Any] = []
    ready_line = READY_PREFIX.encode()

    def read() -> None:
        pending, result = b"", "ended"
        try:
            stream = container.logs(stream=True, follow=True, stdout=True, stderr=False)
            streams.append(stream)
            for chunk in stream:
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                if any(line.startswith(ready_line) for line in lines):
                    result = "ready"
                    break
            stream.close()
        except Exception as exc:  # the stream was closed under us, or the engine's read timed out
            result = f"stream failed: {exc}"
        with contextlib.suppress(queue.Full):
            outcome.put_nowait(result)

    threading.Thread(target=read, name=f"ready-{container.short_id}", daemon=True).start()
    try:
        result = outcome.get(timeout=max(0.0, deadline - time.perf_counter()))
    except queue.Empty:
        for stream in streams:
            stream.close()
        raise BackendError(
            f"{what}: not ready within {ready_timeout_s:g} s; last log lines:\n{log_tail(container)}"
        ) from None
    if result == "ready":
        return
    container.reload()
    if container.status != "running":
        raise exited(container, what)
    log.warning("%s: log stream of %s ended (%s); probing /health instead", what, container.short_id, result)


def wait_health(container: Container, url: str, what: str, deadline: float, ready_timeout_s: float) -> None:
    """GET /health until 200: the runtime's port must answer through the address the gateway uses."""
    delay_s, last = 0.02, "no answer"
    while True:
        try:
            response = httpx.get(f"{url}{HEALTH_PATH}", timeout=max(0.1, min(2.0, deadline - time.perf_counter())))
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        container.reload()
        if container.status != "running":
            raise exited(container, what)
        if time.perf_counter() + delay_s > deadline:
            raise BackendError(
                f"{what}: {url}{HEALTH_PATH} did not answer within {ready_timeout_s:g} s ({last}); "
                f"last log lines:\n{log_tail(container)}"
            )
        time.sleep(delay_s)  # bounded backoff: the port is published a moment after READY at most
        delay_s = min(0.5, delay_s * 2)


def exited(container: Container, what: str) -> BackendError:
    state = container.attrs.get("State", {})
    return BackendError(
        f"{what}: container {container.short_id} {container.status} (exit code {state.get('ExitCode')}"
        f"{', ' + state['Error'] if state.get('Error') else ''}); last log lines:\n{log_tail(container)}"
    )


def log_tail(container: Container) -> str:
    try:
        return bytes(container.logs(tail=LOG_TAIL_LINES)).decode(errors="replace").rstrip() or "(no output)"
    except (DockerException, requests.RequestException) as exc:
        return f"(logs unavailable: {exc})"


def remove(container: Container) -> None:
    try:
        container.remove(force=True)
    except NotFound:
        pass
    except (DockerException, requests.RequestException) as exc:
        log.warning("could not remove container %s: %s", container.name, exc)
