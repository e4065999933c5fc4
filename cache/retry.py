"""Riding out a Redis restart: a command that lost its connection is retried, with capped exponential backoff, for
up to a window of seconds; only then does the error reach the caller.

Only connection errors are retried (refused, reset, closed, still loading the AOF after a restart, and a lost user
while the job's owner has not granted it again); a Redis Cluster client adds the cluster refusing commands while a
master is down (CLUSTERDOWN, TRYAGAIN, a slot not covered; cache/cluster_client.py). A timeout is not: the server
may be executing the command, and a second run of a write is not always harmless. A client retries only once it has
reached the server: a wrong URL or password at start fails at once.

A command whose reply was lost after the server ran it is run again. The hot-path writes are written so that this
repeats nothing (a gradient is stored only with its task's ack; a version is published only over the version it
was computed from); a trajectory batch XADDed in that instant would be stored twice (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio.retry
import redis.retry
from redis.backoff import NoBackoff

T = TypeVar("T")

RECONNECT_ENV = "STELLARIS_REDIS_RECONNECT_S"
DEFAULT_WINDOW_S = 30.0
BASE_S, CAP_S = 0.05, 1.0  # first pause, longest pause


def window_from_env() -> float:
    """The reconnect window: $STELLARIS_REDIS_RECONNECT_S seconds (0 turns retries off), default 30."""
    raw = os.environ.get(RECONNECT_ENV)
    if raw is None or raw == "":
        return DEFAULT_WINDOW_S
    try:
        window = float(raw)
    except ValueError as exc:
        raise ValueError(f"{RECONNECT_ENV} must be a number of seconds, got {raw!r}") from exc
    if not 0 <= window <= 86_400:
        raise ValueError(f"{RECONNECT_ENV} must be between 0 and 86400 seconds, got {raw!r}")
    return window


def pause_s(failures: int) -> float:
    """Capped exponential backoff: 0.05, 0.1, 0.2, 0.4, 0.8, 1, 1, ... seconds."""
    return float(min(CAP_S, BASE_S * 2 ** (failures - 1)))


class _Window:
    """The shared part: when to give up. `armed` turns on once the client has reached the server. Mixed in before
    redis-py's sync or asyncio Retry, whose own constructor it calls (no backoff of its own: `next_pause` decides)."""

    def __init__(
        self,
        window_s: float,
        check: Callable[[], None] | None = None,
        errors: tuple[type[Exception], ...] = (redis.ConnectionError,),
    ) -> None:
        super().__init__(NoBackoff(), retries=-1, supported_errors=(redis.ConnectionError,))  # type: ignore[call-arg]
        self.window_s = window_s
        self.check = check  # raises when retrying is pointless (the embedded server is dead)
        self.errors = errors  # what is retried: connection errors (a cluster client adds CLUSTERDOWN, TRYAGAIN)
        self.armed = False
        self.retried = 0  # retries made, all calls together (a measure for tests and logs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Window:
        # redis-py deep-copies a pool's retry into each connection; one shared policy keeps `armed` and `check` (a
        # bound method of the embedded server, which must not be copied) the same for all of them.
        return self

    def next_pause(self, first_failure: float, failures: int) -> float | None:
        """Seconds to wait before the next try, or None to give up. The window runs from the first failure (a
        blocking read may have started long before the connection was lost)."""
        if self.check is not None:
            self.check()
        left = first_failure + self.window_s - time.monotonic()
        if not self.armed or left <= 0:
            return None
        self.retried += 1
        return min(left, pause_s(failures))


class ReconnectRetry(_Window, redis.retry.Retry):
    """redis-py's retry policy for a sync client (pass as the connection pool's `retry`)."""

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        first_failure, failures = 0.0, 0
        while True:
            try:
                return do()
            except self.errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                first_failure = first_failure or time.monotonic()
                fail(error, failures) if with_failure_count else fail(error)
                pause = self.next_pause(first_failure, failures)
                if pause is None:
                    raise
                time.sleep(pause)


class AsyncReconnectRetry(_Window, redis.asyncio.retry.Retry):
    """The same policy for an asyncio client (the gateway's)."""

    async def call_with_retry(  # type: ignore[override]
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        first_failure, failures = 0.0, 0
        while True:
            try:
                return await do()
            except self.errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                first_failure = first_failure or time.monotonic()
                await (fail(error, failures) if with_failure_count else fail(error))
                pause = self.next_pause(first_failure, failures)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
