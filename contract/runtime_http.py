"""The function runtime's HTTP contract: what `functions.runtime` serves and what the gateway's pool and backends
expect of it. Both sides import these names; neither repeats a path, header or status literal.

    GET  /health   200 liveness
    GET  /ready    200, or 503 while draining or once a call timed out (the process should be recycled)
    POST /invoke   the event as a JSON object; the answer's status is one of `RuntimeStatus`, and an error body is
                   {"error": {"type": <ErrorType or the handler's exception class>, "message", ...}}

A runtime process announces itself with one stdout line, `READY <port>`, once it accepts connections.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

# The module a spawner runs (`python -m functions.runtime`): named here so the gateway need not import functions/.
RUNTIME_MODULE = "functions.runtime"
# The entry a host process that embeds the runtime (the ray backend's actor) imports by this name:
#   start_embedded(handler, *, host, port=0, concurrency=1, timeout_s=60.0, ready_timeout_s=60.0)
# serves `handler` on a thread and returns once connections are accepted, as an object with `.port` and
# `.stop(timeout_s) -> bool` (drain; True when every call finished). The secret comes from SECRET_ENV.
EMBEDDED_RUNTIME = "functions.runtime.embedded:start_embedded"
READY_PREFIX = "READY "

HEALTH_PATH = "/health"
READY_PATH = "/ready"
INVOKE_PATH = "/invoke"

CALL_ID_HEADER = "X-Call-Id"  # sent by the caller (a uuid4 hex when missing), echoed back
WAIT_MS_HEADER = "X-Wait-Ms"  # how long the call waited for a handler slot
DURATION_MS_HEADER = "X-Duration-Ms"  # how long the handler ran: what the gateway meters
RETRY_AFTER_HEADER = "Retry-After"
# A runtime that listens off loopback (a Ray actor on its node's address) answers only calls that carry its secret in
# this header (401 otherwise); the secret reaches it in SECRET_ENV, never on a command line.
SECRET_HEADER = "X-Stellaris-Secret"
SECRET_ENV = "STELLARIS_RUNTIME_SECRET"

RECYCLE_FIELD = "recycle"  # in a 504's error: true when the handler thread still runs and the instance must go


class RuntimeStatus(IntEnum):
    """The status codes /invoke answers."""

    OK = 200
    BAD_REQUEST = 400  # InvalidJSON, InvalidEvent
    UNAUTHORIZED = 401  # the runtime has a secret and the call did not carry it
    QUEUE_FULL = 429  # every slot busy and the queue full
    HANDLER_ERROR = 500  # the handler raised, or its result is not a JSON object
    DRAINING = 503  # shutting down: retry on another instance
    TIMEOUT = 504  # Timeout (recycle) or QueueTimeout


class ErrorType(StrEnum):
    """The runtime's own error types (a handler's exception keeps its class name)."""

    INVALID_JSON = "InvalidJSON"
    INVALID_EVENT = "InvalidEvent"
    UNAUTHORIZED = "Unauthorized"
    INVALID_RESULT = "InvalidResult"
    QUEUE_FULL = "QueueFull"
    QUEUE_TIMEOUT = "QueueTimeout"
    DRAINING = "Draining"
    TIMEOUT = "Timeout"


def gateway_status(runtime_status: int) -> int:
    """What the gateway answers for a runtime's status: the result (200), a timeout (504), else a bad gateway (502).

    A 429 or 503 of one instance is the gateway's own admission's business, not the caller's: the gateway admits
    calls within the function's concurrency, so an instance refusing one is a fault of that instance (502).
    """
    if runtime_status == RuntimeStatus.OK:
        return 200
    if runtime_status == RuntimeStatus.TIMEOUT:
        return 504
    return 502


def runtime_argv(
    handler: str | None, *, port: int, concurrency: int, timeout_s: float, host: str | None = None
) -> list[str]:
    """The runtime's command-line arguments for one instance. `host`, when given, is bound with remote callers
    allowed (a container's 0.0.0.0); `handler` None leaves the handler to the image's entrypoint."""
    argv = ["--handler", handler] if handler else []
    if host is not None:
        argv += ["--host", host, "--allow-remote"]
    return [*argv, "--port", str(port), "--concurrency", str(concurrency), "--timeout-s", f"{timeout_s:g}"]


# The environment a function instance reads besides its settings: the torch device its learner or parameter handler
# computes on (auto, cpu, cuda or cuda:N; functions/model/device.py), set by the control plane per role.
DEVICE_ENV = "STELLARIS_DEVICE"
