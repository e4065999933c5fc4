"""Instance starts that outlive their call or their pool, and the stops they lead to, held module-wide so that the
gateway's shutdown can wait for them (`settle`).

A start runs in a thread that no cancellation stops. When the event loop ended with one still in its thread, the
loop cancelled its task, so nothing stopped the instance once it was up: a container of a function deleted at the
job's end was left running, and never removed (a flake of CI's container stage)."""

from __future__ import annotations

import asyncio
from typing import Any

_STARTS: set[asyncio.Future[Any]] = set()
_STOPS: set[asyncio.Future[Any]] = set()


def _hold(held: set[asyncio.Future[Any]], future: asyncio.Future[Any]) -> None:
    held.add(future)  # the pool may be gone: held here until it is done
    future.add_done_callback(held.discard)


def hold_start(start: asyncio.Future[Any]) -> None:
    _hold(_STARTS, start)


def hold_stop(stop: asyncio.Future[Any]) -> None:
    _hold(_STOPS, stop)


def in_flight() -> int:
    return sum(not f.done() for f in _STARTS | _STOPS)


async def settle(timeout_s: float) -> int:
    """Wait up to `timeout_s` for held starts and stops; returns how many still run then (left behind)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending := {f for f in _STARTS | _STOPS if not f.done()}:
        left = deadline - loop.time()
        if left <= 0:
            return len(pending)
        await asyncio.wait(pending, timeout=left)
        # One turn, so that what a finished start leads to (its call resuming, its done callbacks) runs, and a stop
        # it asks for is held before the next look.
        await asyncio.sleep(0)
    return 0
