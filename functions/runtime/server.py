"""The HTTP server: one handler behind aiohttp, serving the contract of contract/runtime_http.py, with a
graceful drain on SIGTERM. Handlers are synchronous (CPU-bound RL code): each call runs on a pool of `concurrency`
threads so the event loop stays free for /health."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aiohttp import web

from cache import Cache, connect
from cache.connection import REDIS_URL_ENV
from contract.runtime_http import (
    CALL_ID_HEADER,
    DURATION_MS_HEADER,
    HEALTH_PATH,
    INVOKE_PATH,
    READY_PATH,
    RECYCLE_FIELD,
    RETRY_AFTER_HEADER,
    SECRET_HEADER,
    WAIT_MS_HEADER,
    ErrorType,
    RuntimeStatus,
)
from functions.runtime.call_log import current_call_id
from functions.runtime.context import Context, Instance
from functions.runtime.handler import Handler, error_body, load_handler, run_handler
from functions.runtime.settings import RuntimeSettings, runtime_secret
from functions.runtime.slots import Draining, QueueFull, Slots

MAX_EVENT_BYTES = 2 << 30  # above the gateway's largest max_body_bytes (1 GiB) re-serialised
RESPONSE_FLUSH_S = 2.0  # after the drain, how long aiohttp may take to write responses already computed
DRAINING_MESSAGE = "this instance is shutting down; retry on another"
log = logging.getLogger("stellaris.runtime")

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class Runtime:
    """One handler behind aiohttp. `run()` serves until `stop()` or SIGTERM/SIGINT, then drains.

    One `Instance` per process carries the cache connection and memo across invocations. For a Ray actor (or any
    embedding off the main thread), run `asyncio.run(runtime.run(on_ready))` in a thread and call `runtime.stop()`
    from another (functions/runtime/embedded.py); signal handlers are installed only on the main thread.

    `secret` (default: $STELLARIS_RUNTIME_SECRET, SECRET_ENV): when set, every request must carry it in SECRET_HEADER,
    else 401 Unauthorized; a runtime that listens off loopback (a Ray actor on its node's address) has one.
    """

    def __init__(self, settings: RuntimeSettings, handler: Handler | None = None, *, secret: str | None = None) -> None:
        self.settings = settings
        self.handler = handler if handler is not None else load_handler(settings.handler)
        self.secret = secret if secret is not None else runtime_secret()
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
        middlewares = [self._check_secret] if self.secret else []
        app = web.Application(client_max_size=MAX_EVENT_BYTES, middlewares=middlewares)
        app.router.add_get(HEALTH_PATH, self.health)
        app.router.add_get(READY_PATH, self.ready)
        app.router.add_post(INVOKE_PATH, self.invoke)
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
            st = self.settings
            log.info("serving %s on %s:%d, concurrency %d", st.handler, st.host, port, st.concurrency)
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

    @web.middleware
    async def _check_secret(self, request: web.Request, handler: Any) -> web.StreamResponse:
        assert self.secret is not None
        given = request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            log.warning("401: %s %s without the right %s header", request.method, request.path, SECRET_HEADER)
            message = f"this runtime answers only calls that carry its secret in the {SECRET_HEADER} header"
            return _error(RuntimeStatus.UNAUTHORIZED, ErrorType.UNAUTHORIZED, message)
        response: web.StreamResponse = await handler(request)
        return response

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
            return web.json_response({"status": "draining"}, status=RuntimeStatus.DRAINING)
        if self.timed_out:
            return web.json_response({"status": "recycle"}, status=RuntimeStatus.DRAINING)
        return web.json_response({"status": "ready"})

    async def invoke(self, request: web.Request) -> web.Response:
        call_id = request.headers.get(CALL_ID_HEADER) or uuid.uuid4().hex
        token = current_call_id.set(call_id)
        try:
            response = await self._invoke(request)
        finally:
            current_call_id.reset(token)
        response.headers[CALL_ID_HEADER] = call_id
        return response

    async def _invoke(self, request: web.Request) -> web.Response:
        if self.draining:
            return _error(RuntimeStatus.DRAINING, ErrorType.DRAINING, DRAINING_MESSAGE)
        raw = await request.read()
        try:
            event = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
            return _error(RuntimeStatus.BAD_REQUEST, ErrorType.INVALID_JSON, f"request body is not JSON: {exc}")
        if not isinstance(event, dict):
            kind = _JSON_TYPE_NAMES.get(type(event), type(event).__name__)
            message = f"the event must be a JSON object, got a JSON {kind}"
            return _error(RuntimeStatus.BAD_REQUEST, ErrorType.INVALID_EVENT, message)

        timeout_s = self.settings.timeout_s
        queued_at = time.perf_counter()
        try:
            await self.slots.acquire(timeout_s)
        except QueueFull:
            log.warning("429: %d call(s) running, %d queued", self.slots.busy, self.slots.queued)
            message, retry = "every slot is busy and the queue is full", {RETRY_AFTER_HEADER: "1"}
            return _error(RuntimeStatus.QUEUE_FULL, ErrorType.QUEUE_FULL, message, headers=retry)
        except Draining:
            return _error(RuntimeStatus.DRAINING, ErrorType.DRAINING, DRAINING_MESSAGE)
        except TimeoutError:
            message = f"no slot freed within {timeout_s:g} s"
            return _error(RuntimeStatus.TIMEOUT, ErrorType.QUEUE_TIMEOUT, message, extra={RECYCLE_FIELD: False})

        started = time.perf_counter()
        future = self._pool.submit(self._call, event, current_call_id.get())
        future.add_done_callback(self._release_slot)
        try:
            async with asyncio.timeout(timeout_s):
                status, body = await asyncio.wrap_future(future)
        except TimeoutError:
            # A thread cannot be killed: it keeps its slot until it returns, and /ready asks for a recycle.
            self.timed_out += 1
            log.error("timed out after %g s; this instance should be recycled", timeout_s)
            message = f"handler ran past {timeout_s:g} s"
            return _error(RuntimeStatus.TIMEOUT, ErrorType.TIMEOUT, message, extra={RECYCLE_FIELD: True})
        finished = time.perf_counter()
        wait_ms, duration_ms = (started - queued_at) * 1e3, (finished - started) * 1e3
        log.info("invoke %d in %.1f ms (waited %.1f ms)", status, duration_ms, wait_ms)
        headers = {WAIT_MS_HEADER: f"{wait_ms:.3f}", DURATION_MS_HEADER: f"{duration_ms:.3f}"}
        return web.Response(status=status, body=body, content_type="application/json", headers=headers)

    def _release_slot(self, _: Future[tuple[int, bytes]]) -> None:
        # Runs on the handler thread; Slots belongs to the loop thread.
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting anyway
                self._loop.call_soon_threadsafe(self.slots.release)

    def _call(self, event: dict[str, Any], call_id: str) -> tuple[int, bytes]:
        token = current_call_id.set(call_id)
        try:
            return run_handler(self.handler, event, Context(call_id, self.instance))
        finally:
            current_call_id.reset(token)


def _error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None, extra: Mapping[str, Any] | None = None
) -> web.Response:
    """An error response; `extra`: more fields of the error (beside its type and message)."""
    body = error_body(kind, message, **(extra or {}))
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def serve(settings: RuntimeSettings, *, on_ready: Callable[[int], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status (0: drained cleanly). `on_ready(port)` is called once
    connections are accepted."""
    return asyncio.run(Runtime(settings).run(on_ready))
