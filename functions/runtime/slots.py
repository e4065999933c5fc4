"""Concurrency of one runtime: at most `size` handler calls at once and a bounded FIFO queue before them."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


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
