"""The warm pool of one function: admission (concurrency + bounded queue), instance reuse, cold starts,
keep-alive expiry, min-warm and pre-warming, and crash/timeout handling. One pool per function per worker."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.backends.base import Backend, BackendError, InstanceHandle
from gateway.metering import Metrics
from gateway.models import FunctionSpec, Status

# An idle instance older than this is probed with backend.alive() before reuse (a crash while idle must not
# fail the next call).
PROBE_IDLE_AFTER_S = 1.0


class QueueFull(Exception):
    def __init__(self, function: str, retry_after_s: float) -> None:
        super().__init__(f"function {function!r}: concurrency and queue are full")
        self.retry_after_s = retry_after_s


@dataclass
class InvocationFailed(Exception):
    """The call did not produce a result; `status_code` is what the gateway answers."""

    status_code: int
    status: Status
    error: dict[str, Any]
    outcome: Outcome | None = None


@dataclass
class Outcome:
    result: dict[str, Any] | None
    instance: str
    cold: bool
    init_s: float | None
    wait_s: float
    duration_s: float


@dataclass
class Live:
    handle: InstanceHandle
    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    expiry: asyncio.TimerHandle | None = None


class FunctionPool:
    def __init__(self, spec: FunctionSpec, backend: Backend, http: aiohttp.ClientSession, metrics: Metrics) -> None:
        self.spec = spec
        self.backend = backend
        self.http = http
        self.metrics = metrics
        self.instances: dict[str, Live] = {}
        self.starting = 0
        self.waiting = 0
        self.running = 0
        self.idle_seconds = 0.0  # keep-alive time: reported, never charged
        self.init_estimate_s = 2.0
        self._slots = asyncio.Semaphore(spec.max_concurrency)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- admission and invocation -----------------------------------------------------------------------------
    def full(self) -> bool:
        """Every slot and every queue place taken (counting admitted calls that have not reached a slot yet): a
        new call would be refused (429)."""
        return self.running + self.waiting >= self.spec.max_concurrency + self.spec.queue_max

    def admit(self) -> None:
        """Take a place among the waiting calls now, or raise QueueFull: an asynchronous call is admitted before its
        202 is sent, so a 202 is never followed by a rejection."""
        if self.full():
            raise QueueFull(self.spec.name, retry_after_s=max(1.0, self.spec.timeout_s / 10))
        self.waiting += 1
        self._gauges()

    def release_admission(self) -> None:
        """Give back a place `admit` took for a call that will not run."""
        self.waiting -= 1
        self._gauges()

    async def invoke(self, event: dict[str, Any], *, call_id: str, admitted: bool = False) -> Outcome:
        """Run one call: `admitted` when `admit` already took its place."""
        if not admitted:
            self.admit()
        accepted = time.monotonic()
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self._gauges()
        try:
            live, cold, init_s = await self._take_instance()
            wait_s = time.monotonic() - accepted - (init_s or 0.0)
            try:
                return await self._call(live, event, call_id, cold=cold, init_s=init_s, wait_s=wait_s)
            finally:
                await self._give_back(live)
        finally:
            self.running -= 1
            self._slots.release()
            self._gauges()

    async def _take_instance(self) -> tuple[Live, bool, float | None]:
        while True:
            live = await self._idle_instance()
            if live is not None:
                return live, False, None
            if len(self.instances) + self.starting < self.spec.max_instances:
                live = await self._start_instance()
                live.in_flight = 1
                return live, True, live.handle.init_s
            async with self._changed:
                await self._changed.wait()

    async def _idle_instance(self) -> Live | None:
        # Most recently used first, so surplus instances stay idle long enough to expire.
        for live in sorted(self.instances.values(), key=lambda x: -x.idle_since):
            if live.in_flight >= self.spec.concurrency_per_instance:
                continue
            stale = live.in_flight == 0 and time.monotonic() - live.idle_since > PROBE_IDLE_AFTER_S
            if stale and not await asyncio.to_thread(self.backend.alive, live.handle):
                await self._discard(live, replace=True)
                continue
            if live.expiry is not None:
                live.expiry.cancel()
                live.expiry = None
            if live.in_flight == 0:
                self.idle_seconds += time.monotonic() - live.idle_since
            live.in_flight += 1
            return live
        return None

    async def _start_instance(self) -> Live:
        self.starting += 1
        try:
            handle = await asyncio.to_thread(
                self.backend.start, self.spec, instance_id=f"{self.spec.name}-{uuid.uuid4().hex[:8]}"
            )
        except BackendError as exc:
            raise InvocationFailed(502, Status.ERROR, {"type": "InstanceStartFailed", "message": str(exc)}) from exc
        finally:
            self.starting -= 1
        self.init_estimate_s = 0.7 * self.init_estimate_s + 0.3 * handle.init_s
        live = Live(handle)
        self.instances[handle.id] = live
        self.metrics.cold_starts.labels(self.spec.name).inc()
        self.metrics.init_seconds.labels(self.spec.name).observe(handle.init_s)
        self._gauges()
        return live

    async def _call(
        self, live: Live, event: dict[str, Any], call_id: str, *, cold: bool, init_s: float | None, wait_s: float
    ) -> Outcome:
        started = time.monotonic()
        outcome = Outcome(None, live.handle.id, cold, init_s, wait_s, 0.0)
        try:
            async with self.http.post(
                f"{live.handle.url}/invoke",
                json=event,
                headers={"X-Call-Id": call_id},
                timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s + 5.0),
            ) as resp:
                code = resp.status
                try:
                    body = await resp.json(content_type=None)
                except ValueError:  # not JSON (e.g. a proxy's or server's plain-text error page)
                    text = (await resp.text(errors="replace"))[:500]
                    body = {"error": {"type": "BadResponse", "message": f"instance answered {code}: {text}"}}
                duration_ms = resp.headers.get("X-Duration-Ms")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            outcome.duration_s = time.monotonic() - started
            await self._discard(live, replace=True)
            raise InvocationFailed(
                502, Status.ERROR, {"type": "InstanceCrashed", "message": f"instance {live.handle.id} died: {exc}"},
                outcome,
            ) from exc  # fmt: skip
        except TimeoutError as exc:
            outcome.duration_s = time.monotonic() - started
            await self._discard(live, replace=False, kill=True)
            raise InvocationFailed(
                504, Status.TIMEOUT, {"type": "Timeout", "message": f"no answer within {self.spec.timeout_s} s"},
                outcome,
            ) from exc  # fmt: skip
        outcome.duration_s = float(duration_ms) / 1000 if duration_ms else time.monotonic() - started
        if code == 200 and isinstance(body, dict):
            outcome.result = body
            return outcome
        error = body.get("error", body) if isinstance(body, dict) else {"type": "BadResponse", "message": str(body)}
        if code == 504:
            if isinstance(error, dict) and error.get("recycle"):
                await self._discard(live, replace=False, kill=True)
            raise InvocationFailed(504, Status.TIMEOUT, error, outcome)
        raise InvocationFailed(502, Status.ERROR, error, outcome)

    async def _give_back(self, live: Live) -> None:
        if live.handle.id in self.instances:
            live.in_flight -= 1
            if live.in_flight == 0:
                live.idle_since = time.monotonic()
                self._schedule_expiry(live)
        async with self._changed:
            self._changed.notify_all()

    # -- lifecycle --------------------------------------------------------------------------------------------
    def _schedule_expiry(self, live: Live) -> None:
        loop = asyncio.get_running_loop()
        live.expiry = loop.call_later(self.spec.keep_alive_s, lambda: self._spawn(self._expire(live)))

    async def _expire(self, live: Live) -> None:
        """Keep-alive ran out: stop the instance unless it is busy again or needed for min_warm."""
        live.expiry = None
        if live.in_flight or live.handle.id not in self.instances or len(self.instances) <= self.spec.min_warm:
            return
        self.idle_seconds += time.monotonic() - live.idle_since
        await self._discard(live, replace=False)

    async def _discard(self, live: Live, *, replace: bool, kill: bool = False) -> None:
        if self.instances.pop(live.handle.id, None) is None:
            return
        if live.expiry is not None:
            live.expiry.cancel()
        kill_fn = getattr(self.backend, "kill", None)
        if kill and kill_fn is not None:
            await asyncio.to_thread(kill_fn, live.handle)
        self._spawn(asyncio.to_thread(self.backend.stop, live.handle))
        self._gauges()
        if replace and not self._closed:
            self._spawn(self.ensure_min_warm(at_least=1))
        async with self._changed:
            self._changed.notify_all()

    async def ensure_min_warm(self, *, at_least: int = 0) -> int:
        """Start instances until min_warm (or `at_least`) are up; returns how many were started."""
        want = min(max(self.spec.min_warm, at_least), self.spec.max_instances)
        missing = want - len(self.instances) - self.starting
        started = await asyncio.gather(*(self._warm_one() for _ in range(max(missing, 0))))
        return sum(started)

    async def _warm_one(self, delay_s: float = 0.0) -> bool:
        if delay_s > 0:
            await asyncio.sleep(delay_s)  # a scheduled pre-warm: start just in time for the deadline
        if self._closed or len(self.instances) + self.starting >= self.spec.max_instances:
            return False
        try:
            live = await self._start_instance()
        except InvocationFailed:
            # A call may be waiting for this start (the pool was full with it): wake it to start one itself.
            async with self._changed:
                self._changed.notify_all()
            return False
        live.idle_since = time.monotonic()
        self._schedule_expiry(live)
        async with self._changed:
            self._changed.notify_all()
        return True

    async def prewarm(self, count: int, *, by_s: float | None, wait_s: float = 0.0) -> dict[str, Any]:
        """Have `count` instances warm by `by_s` seconds from now (as soon as possible when None): each start is
        scheduled `init_estimate_s` (measured start time) before the deadline. Waits up to `wait_s` for them."""
        missing = min(count, self.spec.max_instances) - len(self.instances) - self.starting
        delay = max(0.0, (by_s or 0.0) - self.init_estimate_s)
        tasks = [self._spawn(self._warm_one(delay)) for _ in range(max(missing, 0))]
        if tasks and wait_s > 0:
            await asyncio.wait(tasks, timeout=wait_s)
        return {
            "function": self.spec.name,
            "starting": max(missing, 0),
            "start_in_s": delay,
            "warm": len(self.instances),
            "init_estimate_s": self.init_estimate_s,
        }

    def adopt(self, handles: list[InstanceHandle]) -> None:
        """Take over instances found again after a gateway restart."""
        for handle in handles:
            if handle.id not in self.instances and len(self.instances) < self.spec.max_instances:
                live = Live(handle)
                self.instances[handle.id] = live
                self._schedule_expiry(live)
        self._gauges()

    async def close(self, *, stop_instances: bool = True) -> None:
        self._closed = True
        for live in list(self.instances.values()):
            if live.expiry is not None:
                live.expiry.cancel()
        if stop_instances:
            await asyncio.gather(*(asyncio.to_thread(self.backend.stop, lv.handle) for lv in self.instances.values()))
        self.instances.clear()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {
            "instances": [
                {
                    "id": lv.handle.id,
                    "url": lv.handle.url,
                    "in_flight": lv.in_flight,
                    "pid": lv.handle.pid,
                    "container_id": lv.handle.container_id,
                }
                for lv in self.instances.values()
            ],
            "starting": self.starting,
            "running": self.running,
            "queued": self.waiting,
            "keep_alive_idle_s": round(self.idle_seconds, 3),
        }

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _gauges(self) -> None:
        self.metrics.warm_instances.labels(self.spec.name).set(len(self.instances))
        self.metrics.queue_depth.labels(self.spec.name).set(self.waiting)
