"""The function runtime: serve one handler over HTTP, so the same code runs as a process, a container or a Ray actor.

A tiny contract in the manner of OpenFaaS's of-watchdog, declared in contract/runtime_http.py (paths,
headers, statuses) and shared with the gateway:

    GET  /health   liveness, 200 {"status": "ok", "handler", "pid", "in_flight", "queued", "timed_out"}
    GET  /ready    200 {"status": "ready"}; 503 {"status": "draining"} after SIGTERM, or {"status": "recycle"}
                   once a call has timed out (its thread cannot be killed: replace this process)
    POST /invoke   body: the event, a JSON object. Header X-Call-Id (a uuid4 hex when missing) is echoed back,
                   with X-Wait-Ms (waiting for a slot) and X-Duration-Ms (the handler) when the handler ran.
        200  the handler's result, a JSON object
        400  {"error": {"type": "InvalidJSON" | "InvalidEvent", "message"}}
        429  {"error": {"type": "QueueFull", "message"}} + Retry-After: every slot busy and the queue full
        500  {"error": {"type": <exception class>, "message", "traceback"}}: the handler raised
        500  {"error": {"type": "InvalidResult", "message"}}: the result is not a JSON-serialisable dict
        503  {"error": {"type": "Draining", "message"}}: shutting down, retry on another instance
        504  {"error": {"type": "Timeout", "message", "recycle": true}}: the handler ran past timeout_s
        504  {"error": {"type": "QueueTimeout", "message", "recycle": false}}: no slot freed within timeout_s
    With a secret in STELLARIS_RUNTIME_SECRET (a runtime off loopback: the ray backend's actors), every request must
    carry it in X-Stellaris-Secret, else 401 {"error": {"type": "Unauthorized", "message"}}.

Its four jobs, one module each: `settings` (what to serve, validated once), `slots` (concurrency and the bounded
queue), `server` (the HTTP server and its drain; `handler` and `call_log` beside it) and `cli` (the command line,
`python -m functions.runtime`); `embedded` serves it from a thread of a host process (a Ray actor).
"""

from functions.runtime.call_log import CallIdFilter, configure_logging
from functions.runtime.cli import main
from functions.runtime.handler import Handler, load_handler
from functions.runtime.server import Runtime, serve
from functions.runtime.settings import RuntimeSettings, is_loopback_literal
from functions.runtime.slots import Draining, QueueFull, Slots

__all__ = [
    "CallIdFilter",
    "Draining",
    "Handler",
    "QueueFull",
    "Runtime",
    "RuntimeSettings",
    "Slots",
    "configure_logging",
    "is_loopback_literal",
    "load_handler",
    "main",
    "serve",
]
