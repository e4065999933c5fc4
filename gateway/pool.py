"""The warm pool of one function: instance reuse, cold starts, keep-alive expiry, min-warm and pre-warming, and
crash/timeout handling. One pool per function per worker. Which calls may run is decided by its admission
(gateway/admission.py); each call goes over the runtime's HTTP contract (gateway/invocation.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import aiohttp

from gateway.admission import Admission
from gateway.backends.base import Backend, BackendError, InstanceHandle
from gateway.hung import BusyProbes
from gateway.instances import Live, reuse_order
from gateway.invocation import InstanceUnreachable, InvocationFailed, Outcome, post_event
from gateway.late_starts import hold_start, hold_stop
from gateway.liveness import IdleProbes
from gateway.metering import Metrics
from gateway.models import FunctionSpec, Status

# The gateway waits this much longer than the function's timeout_s, so that the runtime's own 504 arrives first.
ANSWER_MARGIN_S = 5.0


class FunctionPool(IdleProbes, BusyProbes):
    def __init__(
        self,
        spec: FunctionSpec,
        backend: Backend,
        http: aiohttp.ClientSession,
        metrics: Metrics,
        *,
        stop_timeout_s: float,
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.http = http
        self.metrics = metrics
        self.stop_timeout_s = stop_timeout_s  # an instance's drain, before it is killed
        self.instances: dict[str, Live] = {}
        self.starting = 0
        self.idle_seconds = 0.0  # keep-alive time: reported, never charged
        self.init_estimate_s = 2.0
        self.admission = Admission(spec, on_change=self._gauges)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._stop_late_starts = True
        self.swept: list[str] = []  # found dead by probe_idle, not yet reported by a call

    # -- invocation -------------------------------------------------------------------------------------------
    async def invoke(
        self, event: dict[str, Any], *, call_id: str, admitted: bool = False, affinity: str | None = None
    ) -> Outcome:
        """Run one call: `admitted` when `admission.admit()` already took its place; `affinity`: reuse the instance
        that last served that key if it is idle (gateway/instances.py)."""
        async with self.admission.slot(admitted=admitted) as accepted:
            dead, self.swept = self.swept, []  # idle instances found dead since the last call, and on its way
            live, cold, init_s = await self._take_instance(affinity, dead)
            live.affinity = affinity or live.affinity
            wait_s = time.monotonic() - accepted - (init_s or 0.0)
            if (calling := getattr(self.backend, "calling", None)) is not None:
                calling(live.handle)  # the process backend pins an instance to cores at its first call
            try:
                return await self._call(live, event, call_id, cold=cold, init_s=init_s, wait_s=wait_s, dead=len(dead))
            finally:
                await self._give_back(live)

    async def _take_instance(self, affinity: str | None, dead: list[str]) -> tuple[Live, bool, float | None]:
        while True:
            live = await self._idle_instance(affinity, dead)
            if live is not None:
                return live, False, None
            if len(self.instances) + self.starting < self.spec.max_instances:
                live = await self._start_instance()
                live.in_flight = 1
                return live, True, live.handle.init_s
            async with self._changed:
                await self._changed.wait()

    async def _idle_instance(self, affinity: str | None, dead: list[str]) -> Live | None:
        for live in reuse_order(self.instances.values(), affinity):
            if live.in_flight >= self.spec.concurrency_per_instance:
                continue
            if self._stale(live) and await self._found_dead(live, "idle"):
                dead.append(live.handle.id)
                continue
            if live.in_flight >= self.spec.concurrency_per_instance or live.handle.id not in self.instances:
                continue  # taken or discarded by another call while this one probed it
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
        # Shielded: a start cancelled by the pool closing runs on in its thread, and its instance is stopped late.
        start = asyncio.ensure_future(
            asyncio.to_thread(self.backend.start, self.spec, instance_id=f"{self.spec.name}-{uuid.uuid4().hex[:8]}")
        )
        hold_start(start)  # the gateway's shutdown waits for it (gateway/late_starts.py)
        try:
            handle = await asyncio.shield(start)
        except asyncio.CancelledError:
            start.add_done_callback(self._stop_late_start)
            raise
        except BackendError as exc:
            raise InvocationFailed(502, Status.ERROR, {"type": "InstanceStartFailed", "message": str(exc)}) from exc
        finally:
            self.starting -= 1
        if self._closed:
            self._stop_late_start(start)
            error = {"type": "FunctionDeleted", "message": f"function {self.spec.name!r} was deleted or replaced"}
            raise InvocationFailed(503, Status.ERROR, error)
        self.init_estimate_s = 0.7 * self.init_estimate_s + 0.3 * handle.init_s
        live = Live(handle)
        self.instances[handle.id] = live
        self.metrics.cold_starts.labels(self.spec.name).inc()
        self.metrics.init_seconds.labels(self.spec.name).observe(handle.init_s)
        self._gauges()
        return live

    async def _call(
        self,
        live: Live,
        event: dict[str, Any],
        call_id: str,
        *,
        cold: bool,
        init_s: float | None,
        wait_s: float,
        dead: int,
    ) -> Outcome:
        started = time.monotonic()
        handle = live.handle
        outcome = Outcome(None, handle.id, cold, init_s, wait_s, 0.0, handle.container_id, handle.node, dead)
        timeout_s = self.spec.timeout_s + ANSWER_MARGIN_S
        try:
            answer = await post_event(
                self.http, handle.url, event, call_id=call_id, timeout_s=timeout_s, secret=handle.secret
            )
        except InstanceUnreachable as exc:
            outcome.duration_s = time.monotonic() - started
            await self._discard(live, replace=True, kill=True)  # gone before we say so: its leases may be freed
            error = self.death(live, exc)
            raise InvocationFailed(502, Status.ERROR, error, outcome) from exc
        except TimeoutError as exc:
            outcome.duration_s = time.monotonic() - started
            await self._discard(live, replace=False, kill=True)
            error = {"type": "Timeout", "message": f"no answer within {self.spec.timeout_s} s"}
            raise InvocationFailed(504, Status.TIMEOUT, error, outcome) from exc
        outcome.duration_s = answer.duration_s if answer.duration_s is not None else time.monotonic() - started
        if answer.ok:
            outcome.result = answer.body
            return outcome
        if answer.recycle:
            await self._discard(live, replace=False, kill=True)
        raise answer.failure(outcome)

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
        if kill:  # best effort: the stop below ends it anyway, and a call's answer must not turn into a 500
            with contextlib.suppress(BackendError):
                await asyncio.to_thread(self.backend.kill, live.handle)
        self._spawn(self._stop(live.handle))
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
        """Have `count` instances warm `by_s` seconds from now (None: now), each start `init_estimate_s` (measured)
        before the deadline. Waits up to `wait_s` for them."""
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

    def adopt(self, handles: list[InstanceHandle]) -> list[InstanceHandle]:
        """Take over instances found again after a gateway restart: only this function's, started on this backend
        for this very spec, up to max_instances. Returns the ones it refused, for the caller to stop."""
        digest = self.spec.digest()
        refused = []
        for handle in handles:
            if handle.id in self.instances:
                continue
            ours = (handle.function, handle.backend, handle.spec_digest) == (self.spec.name, self.backend.name, digest)
            if not ours or len(self.instances) >= self.spec.max_instances:
                refused.append(handle)
                continue
            live = Live(handle)
            self.instances[handle.id] = live
            self._schedule_expiry(live)
        self._gauges()
        return refused

    async def close(self, *, stop_instances: bool = True) -> None:
        self._closed = True
        self._stop_late_starts = stop_instances
        for live in list(self.instances.values()):
            if live.expiry is not None:
                live.expiry.cancel()
        if stop_instances:
            await asyncio.gather(*(self._stop(lv.handle) for lv in self.instances.values()))
        self.instances.clear()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stop(self, handle: InstanceHandle) -> None:
        await asyncio.to_thread(self.backend.stop, handle, timeout_s=self.stop_timeout_s)

    def _stop_late_start(self, start: asyncio.Future[InstanceHandle]) -> None:
        """An instance up after the pool closed: stopped with the rest (delete, replace), else left for adoption."""
        if start.cancelled() or start.exception() is not None or not self._stop_late_starts:
            return
        hold_stop(asyncio.ensure_future(self._stop(start.result())))

    def status(self) -> dict[str, Any]:
        fields = ("id", "url", "pid", "container_id", "node")
        return {
            "instances": [
                {**{name: getattr(lv.handle, name) for name in fields}, "in_flight": lv.in_flight}
                for lv in self.instances.values()
            ],
            "starting": self.starting,
            "running": self.admission.running,
            "queued": self.admission.waiting,
            "keep_alive_idle_s": round(self.idle_seconds, 3),
        }

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _gauges(self) -> None:
        self.metrics.warm_instances.labels(self.spec.name).set(len(self.instances))
        self.metrics.queue_depth.labels(self.spec.name).set(self.admission.waiting)
