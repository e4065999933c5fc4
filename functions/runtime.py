"""The function runtime: serve one handler over HTTP, so the same code runs as a process, a container or a Ray actor.

A tiny contract in the manner of OpenFaaS's of-watchdog:

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

Handlers are synchronous (CPU-bound RL code): each call runs on a pool of `concurrency` threads so the event loop
stays free for /health. One `Instance` per process carries the cache connection and memo across invocations.

Start: `python -m functions.runtime --handler pkg.mod:func` writes exactly one stdout line, `READY <port>`, once it
accepts connections (no READY and a non-zero exit when the handler cannot be loaded or the port bound). Stop:
SIGTERM or SIGINT drains (new calls get 503, running ones finish within --drain-timeout-s), closes the cache if it
was opened and exits 0, or 1 when a running call had to be abandoned; a second signal cuts the drain short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import importlib
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cache import Cache, connect
from cache.connection import REDIS_URL_ENV
from functions.context import Context, Instance

Handler = Callable[[dict[str, Any], Context], dict[str, Any]]

CALL_ID_HEADER = "X-Call-Id"
TRACEBACK_LINES = 20
MAX_EVENT_BYTES = 2 << 30  # above the gateway's largest max_body_bytes (1 GiB) re-serialised
RESPONSE_FLUSH_S = 2.0  # after the drain, how long aiohttp may take to write responses already computed
log = logging.getLogger("stellaris.runtime")

# The call being served by this task or handler thread, so that every log line can carry its id (CallIdFilter).
_call_id: contextvars.ContextVar[str] = contextvars.ContextVar("call_id", default="-")

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class RuntimeSettings(BaseModel):
    """What one runtime process serves and its bounds; validated once, at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    handler: str = Field(description="package.module:function")
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 binds a free port")
    concurrency: int = Field(default=1, gt=0, description="handler calls at once (SPEC §6: 1 per instance)")
    queue_max: int = Field(default=16, ge=0, description="calls waiting for a slot; beyond that 429")
    timeout_s: float = Field(default=60.0, gt=0, description="bound on one call, and on its wait for a slot")
    drain_timeout_s: float | None = Field(default=None, gt=0, description="SIGTERM grace; None: timeout_s")
    allow_remote: bool = Field(default=False, description="allow a non-loopback host (containers bind 0.0.0.0)")

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> RuntimeSettings:
        if not self.allow_remote and not is_loopback(self.host):
            raise ValueError(f"host {self.host!r} is not loopback; pass --allow-remote to serve on it")
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_handler(target: str) -> Handler:
    """Import `package.module:function` (the attribute may be dotted, e.g. `mod:Class.method`)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handler must look like 'package.module:function', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{target!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"{target!r} is not callable")
    return obj


class QueueFull(Exception):
    """Every slot is busy and `queue_max` calls already wait."""


class Draining(Exception):
    """The runtime is shutting down and takes no more calls."""


class Slots:
    """At most `size` handler calls at once, up to `queue_max` FIFO waiters; `drain()` turns the waiters away.

    Used on the event-loop thread only. A slot comes back when the handler thread really ends, not when its caller
    stops waiting (a timed-out thread still occupies a worker), so never more than `size` handler threads run.
    """

    def __init__(self, size: int, queue_max: int) -> None:
        self.size = size
        self.free = size
        self.queue_max = queue_max
        self.idle = asyncio.Event()  # set while no slot is taken: what the drain waits for
        self.idle.set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._draining = False

    @property
    def busy(self) -> int:
        return self.size - self.free

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout_s: float) -> None:
        if self._draining:
            raise Draining
        if self.free > 0 and not self._waiters:
            self.free -= 1
            self.idle.clear()
            return
        if len(self._waiters) >= self.queue_max:
            raise QueueFull
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter  # release() hands its slot straight to the first waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # handed a slot just as the wait ran out: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
        if self.free == self.size:
            self.idle.set()

    def drain(self) -> None:
        self._draining = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Draining())


class Runtime:
    """One handler behind aiohttp. `run()` serves until `stop()` or SIGTERM/SIGINT, then drains.

    For a Ray actor (or any embedding off the main thread), run `asyncio.run(runtime.run(on_ready))` in a thread
    and call `runtime.stop()` from another; signal handlers are installed only on the main thread.
    """

    def __init__(self, settings: RuntimeSettings, handler: Handler | None = None) -> None:
        self.settings = settings
        self.handler = handler if handler is not None else load_handler(settings.handler)
        self.instance = Instance(connect=self._connect_cache)
        self.draining = False
        self.timed_out = 0  # calls answered 504 Timeout; their threads may still run
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="handler")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._slots: Slots | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None

    @property
    def slots(self) -> Slots:
        if self._slots is None:
            raise RuntimeError("the runtime is not running")
        return self._slots

    @property
    def abandoned(self) -> int:
        """Handler threads still running after run() returned (they cannot be killed)."""
        return self._slots.busy if self._slots is not None else 0

    def app(self) -> web.Application:
        # Bodies come from the gateway, which enforces its own (configurable) cap: accept anything it may forward.
        app = web.Application(client_max_size=MAX_EVENT_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_post("/invoke", self.invoke)
        return app

    async def run(self, on_ready: Callable[[int], None] | None = None) -> int:
        """Serve until stopped; returns 0 when the drain finished every call, 1 when some had to be abandoned."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._slots = Slots(self.settings.concurrency, self.settings.queue_max)
        self._stop, self._hurry = asyncio.Event(), asyncio.Event()
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=RESPONSE_FLUSH_S)
        await runner.setup()
        clean = False
        try:
            site = web.TCPSite(runner, self.settings.host, self.settings.port)
            await site.start()
            port = int(runner.addresses[0][1])
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.add_signal_handler(sig, self._request_stop)
            log.info(
                "serving %s on %s:%d, concurrency %d",
                self.settings.handler,
                self.settings.host,
                port,
                self.settings.concurrency,
            )
            if on_ready is not None:
                on_ready(port)
            await self._stop.wait()
            clean = await self._drain()
        finally:
            await runner.cleanup()  # closes the listening socket, then idle keep-alive connections
            self._pool.shutdown(wait=False, cancel_futures=True)
            if self.instance.cache_opened:
                self.instance.close()
                log.info("cache closed")
        return 0 if clean else 1

    def stop(self) -> None:
        """Begin the graceful drain; thread-safe. A second call cuts the drain short."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: run() has already returned
                self._loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        assert self._stop is not None and self._hurry is not None
        (self._hurry if self._stop.is_set() else self._stop).set()

    async def _drain(self) -> bool:
        """Refuse new calls (503) and queued ones, wait for running ones; True when none was abandoned."""
        assert self._hurry is not None
        self.draining = True
        self.slots.drain()
        log.info("draining: %d call(s) running", self.slots.busy)
        bound_s = self.settings.drain_timeout_s or self.settings.timeout_s
        waits = [asyncio.ensure_future(self.slots.idle.wait()), asyncio.ensure_future(self._hurry.wait())]
        await asyncio.wait(waits, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        if self.slots.busy:
            log.warning("drain ended with %d call(s) still running; abandoning them", self.slots.busy)
            return False
        log.info("drained")
        return True

    def _connect_cache(self) -> Cache:
        # Without REDIS_URL the cache starts an embedded redis-server, which the kernel kills when the *thread*
        # that started it ends (PR_SET_PDEATHSIG, cache/server.py). Start it on the event-loop thread, which
        # outlives every handler thread. A remote Redis is connected from the handler's own thread, so an
        # unreachable server cannot stall the loop (and /health) for its connect timeout.
        if os.environ.get(REDIS_URL_ENV) or self._loop is None or threading.get_ident() == self._loop_thread:
            return connect()

        async def connect_on_loop() -> Cache:
            return connect()

        return asyncio.run_coroutine_threadsafe(connect_on_loop(), self._loop).result()

    async def health(self, request: web.Request) -> web.Response:
        slots = self.slots
        body = {
            "status": "ok",
            "handler": self.settings.handler,
            "pid": os.getpid(),
            "in_flight": slots.busy,
            "queued": slots.queued,
            "timed_out": self.timed_out,
        }
        return web.json_response(body)

    async def ready(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.timed_out:
            return web.json_response({"status": "recycle"}, status=503)
        return web.json_response({"status": "ready"})

    async def invoke(self, request: web.Request) -> web.Response:
        call_id = request.headers.get(CALL_ID_HEADER) or uuid.uuid4().hex
        token = _call_id.set(call_id)
        try:
            response = await self._invoke(request)
        finally:
            _call_id.reset(token)
        response.headers[CALL_ID_HEADER] = call_id
        return response

    async def _invoke(self, request: web.Request) -> web.Response:
        if self.draining:
            return _error(503, "Draining", "this instance is shutting down; retry on another")
        raw = await request.read()
        try:
            event = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
            return _error(400, "InvalidJSON", f"request body is not JSON: {exc}")
        if not isinstance(event, dict):
            kind = _JSON_TYPE_NAMES.get(type(event), type(event).__name__)
            return _error(400, "InvalidEvent", f"the event must be a JSON object, got a JSON {kind}")

        queued_at = time.perf_counter()
        try:
            await self.slots.acquire(self.settings.timeout_s)
        except QueueFull:
            log.warning("429: %d call(s) running, %d queued", self.slots.busy, self.slots.queued)
            return _error(429, "QueueFull", "every slot is busy and the queue is full", headers={"Retry-After": "1"})
        except Draining:
            return _error(503, "Draining", "this instance is shutting down; retry on another")
        except TimeoutError:
            message = f"no slot freed within {self.settings.timeout_s:g} s"
            return _error(504, "QueueTimeout", message, recycle=False)

        started = time.perf_counter()
        future = self._pool.submit(self._call, event, _call_id.get())
        future.add_done_callback(self._release_slot)
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                status, body = await asyncio.wrap_future(future)
        except TimeoutError:
            # A thread cannot be killed: it keeps its slot until it returns, and /ready asks for a recycle.
            self.timed_out += 1
            log.error("timed out after %g s; this instance should be recycled", self.settings.timeout_s)
            return _error(504, "Timeout", f"handler ran past {self.settings.timeout_s:g} s", recycle=True)
        finished = time.perf_counter()
        log.info(
            "invoke %d in %.1f ms (waited %.1f ms)", status, (finished - started) * 1e3, (started - queued_at) * 1e3
        )
        headers = {
            "X-Wait-Ms": f"{(started - queued_at) * 1e3:.3f}",
            "X-Duration-Ms": f"{(finished - started) * 1e3:.3f}",
        }
        return web.Response(status=status, body=body, content_type="application/json", headers=headers)

    def _release_slot(self, _: Future[tuple[int, bytes]]) -> None:
        # Runs on the handler thread; Slots belongs to the loop thread.
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting anyway
                self._loop.call_soon_threadsafe(self.slots.release)

    def _call(self, event: dict[str, Any], call_id: str) -> tuple[int, bytes]:
        """Run the handler on a pool thread. Never raises: every outcome becomes a status and a JSON body."""
        token = _call_id.set(call_id)
        try:
            try:
                result = self.handler(event, Context(call_id, self.instance))
            except BaseException as exc:  # a thread boundary: not even SystemExit may take the server down
                log.exception("handler raised %s", type(exc).__name__)
                return 500, _error_body(type(exc).__name__, str(exc), traceback=_traceback_tail(exc))
            if not isinstance(result, dict):
                kind = type(result).__name__
                return 500, _error_body("InvalidResult", f"handler returned a {kind}, not a dict (a JSON object)")
            try:
                # Serialised here, off the loop: a large result would otherwise stall every other request.
                return 200, json.dumps(result, allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                log.error("handler result is not JSON: %s", exc)
                return 500, _error_body("InvalidResult", f"handler result is not JSON-serialisable: {exc}")
        finally:
            _call_id.reset(token)


def _error_body(kind: str, message: str, **extra: Any) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message, **extra}}).encode()


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    body = _error_body(kind, message, **extra)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _traceback_tail(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-TRACEBACK_LINES:])


def serve(
    handler_target: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    on_ready: Callable[[int], None] | None = None,
    **settings: Any,
) -> int:
    """Serve `handler_target` until SIGTERM/SIGINT; returns the exit status (0: drained cleanly).

    `settings` are the other RuntimeSettings fields (concurrency, queue_max, timeout_s, drain_timeout_s,
    allow_remote); `on_ready(port)` is called once connections are accepted.
    """
    runtime = Runtime(RuntimeSettings(handler=handler_target, host=host, port=port, **settings))
    return asyncio.run(runtime.run(on_ready))


class CallIdFilter(logging.Filter):
    """Stamp each record with the call being served, unless it carries one (Context.log passes it explicitly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "call_id"):
            record.call_id = _call_id.get()
        return True


def configure_logging(level: str) -> None:
    """Log to stderr, one line per record, each with its call id; stdout is kept for the READY line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(CallIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [call %(call_id)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _announce_ready(port: int) -> None:
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()
    # From here on stdout carries nothing for the spawner: point it at stderr, so that a spawner may stop reading
    # the pipe without a chatty handler's prints filling it and blocking the handler.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functions.runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--handler", required=True, help="package.module:function")
    parser.add_argument("--host", default="127.0.0.1", help="loopback unless --allow-remote")
    parser.add_argument("--port", type=int, default=0, help="0 binds a free port (see the READY line)")
    parser.add_argument("--concurrency", type=int, default=1, help="handler calls at once")
    parser.add_argument("--queue-max", type=int, default=16, help="calls waiting for a slot; beyond that 429")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per call; past it 504 and recycle")
    parser.add_argument("--drain-timeout-s", type=float, default=None, help="SIGTERM grace (default: timeout)")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host, e.g. 0.0.0.0")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("STELLARIS_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    args = parser.parse_args(argv)
    try:
        settings = RuntimeSettings(
            handler=args.handler,
            host=args.host,
            port=args.port,
            concurrency=args.concurrency,
            queue_max=args.queue_max,
            timeout_s=args.timeout_s,
            drain_timeout_s=args.drain_timeout_s,
            allow_remote=args.allow_remote,
        )
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        parser.error("; ".join(problems).replace("Value error, ", ""))

    configure_logging(args.log_level)
    try:
        runtime = Runtime(settings)
    except Exception:
        log.exception("cannot load handler %s", settings.handler)
        return 1
    try:
        code = asyncio.run(runtime.run(on_ready=_announce_ready))
    except OSError as exc:  # e.g. the port is taken
        log.error("cannot serve on %s:%d: %s", settings.host, settings.port, exc)
        return 1
    if runtime.abandoned:
        # Abandoned handler threads cannot be killed, and the interpreter would wait for them at exit.
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
