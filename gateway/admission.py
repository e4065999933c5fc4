"""Admission to one function: at most `max_concurrency` calls run at once and `queue_max` wait; beyond that a call is
refused at once (429) rather than queued without bound."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from gateway.models import FunctionSpec


class PoolFull(Exception):
    """Every slot and queue place of the function is taken (429)."""

    def __init__(self, function: str, retry_after_s: float) -> None:
        super().__init__(f"function {function!r}: concurrency and queue are full")
        self.retry_after_s = retry_after_s


class Admission:
    """`waiting` counts admitted calls that have no slot yet, `running` those that have one; `on_change` is called
    whenever either changes (the pool's gauges)."""

    def __init__(self, spec: FunctionSpec, on_change: Callable[[], None]) -> None:
        self.spec = spec
        self.waiting = 0
        self.running = 0
        self._slots = asyncio.Semaphore(spec.max_concurrency)
        self._on_change = on_change

    def full(self) -> bool:
        """Every slot and every queue place taken (counting admitted calls that have not reached a slot yet): a
        new call would be refused (429)."""
        return self.running + self.waiting >= self.spec.max_concurrency + self.spec.queue_max

    def admit(self) -> None:
        """Take a place among the waiting calls now, or raise PoolFull: an asynchronous call is admitted before its
        202 is sent, so a 202 is never followed by a rejection."""
        if self.full():
            raise PoolFull(self.spec.name, retry_after_s=max(1.0, self.spec.timeout_s / 10))
        self.waiting += 1
        self._on_change()

    def release(self) -> None:
        """Give back a place `admit` took for a call that will not run."""
        self.waiting -= 1
        self._on_change()

    @contextlib.asynccontextmanager
    async def slot(self, *, admitted: bool) -> AsyncIterator[float]:
        """Hold a running slot for the body; yields when the call was accepted (monotonic). `admitted` when `admit`
        already took its place."""
        if not admitted:
            self.admit()
        accepted = time.monotonic()
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self._on_change()
        try:
            yield accepted
        finally:
            self.running -= 1
            self._slots.release()
            self._on_change()
