"""The gateway's asyncio Redis client, for a single server or (a `redis+cluster://` URL) a Redis Cluster.

Either way it is bounded: at most `max_connections` commands in flight, a request waiting up to `wait_s` for a free
one rather than failing; and a command that lost its connection (or, on a cluster, met a master that is down) is
retried within the cache's reconnect window (cache/retry.py). The gateway's keys share one hash tag per namespace
(cache/keys.py GatewayKeys), so its transactions and scripts stay in one slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.asyncio.retry
from redis.backoff import NoBackoff

from cache import Cache
from cache.cluster_client import node_url
from cache.retry import AsyncReconnectRetry

GatewayRedis = aioredis.Redis | redis.asyncio.cluster.RedisCluster


def gateway_redis(cache: Cache, *, max_connections: int, wait_s: float) -> GatewayRedis:
    """A client on the server or cluster `cache` reached (its URL, retry window and dead-server check)."""
    if max_connections <= 0 or wait_s <= 0:
        raise ValueError(f"max_connections and wait_s must be positive, got {max_connections} and {wait_s}")
    retry = AsyncReconnectRetry(cache.settings.reconnect_window_s, check=cache.retry.check, errors=cache.retry.errors)
    retry.armed = True  # `cache` has reached the server
    if cache.cluster:
        return GatewayCluster.from_url(
            node_url(cache.url),
            reconnect=retry,
            retry=redis.asyncio.retry.Retry(NoBackoff(), 0),  # `reconnect` alone retries: never on a timeout
            slots=asyncio.BoundedSemaphore(max_connections),
            wait_s=wait_s,
            max_connections=max_connections,  # per node; the semaphore keeps the total within it too
            socket_timeout=cache.settings.socket_timeout_s,
            socket_connect_timeout=cache.settings.connect_timeout_s,
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        cache.url, max_connections=max_connections, timeout=wait_s, retry=retry
    )
    return aioredis.Redis(connection_pool=pool)


class GatewayCluster(redis.asyncio.cluster.RedisCluster):
    """An asyncio cluster client with the gateway's bound (`slots`, waited for up to `wait_s`) and retry window."""

    def __init__(
        self, *args: Any, reconnect: AsyncReconnectRetry, slots: asyncio.BoundedSemaphore, wait_s: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.reconnect, self.slots, self.wait_s = reconnect, slots, wait_s
        # Whether this task already holds a place (a pipeline resends a redirected command through the client).
        self._holding = contextvars.ContextVar(f"holding-{id(self)}", default=False)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the `max_connections` places, waited for like a blocking pool's connection."""
        if self._holding.get():
            yield
            return
        try:
            await asyncio.wait_for(self.slots.acquire(), self.wait_s)
        except TimeoutError as exc:
            raise redis.ConnectionError(f"no free Redis connection within {self.wait_s} s") from exc
        token = self._holding.set(True)
        try:
            yield
        finally:
            self._holding.reset(token)
            self.slots.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.slot():
            return await self.reconnect.call_with_retry(
                functools.partial(super().execute_command, *args, **kwargs), _ignore
            )

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> GatewayClusterPipeline:
        if shard_hint:
            raise redis.cluster.RedisClusterException("shard_hint is deprecated in cluster mode")
        # The ignore: redis-py's CommandsProtocol declares `_event_dispatcher`, which its ClusterPipeline never sets
        # (redis-py's own `RedisCluster.pipeline` builds one just so).
        return GatewayClusterPipeline(self, transaction)  # type: ignore[abstract]


class GatewayClusterPipeline(redis.asyncio.cluster.ClusterPipeline):
    """A cluster pipeline that takes one of its client's places and is retried whole within the window."""

    cluster_client: GatewayCluster

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        queued = [(c.args, c.kwargs) for c in getattr(self._execution_strategy, "_command_queue", [])]
        first = True

        async def run() -> list[Any]:
            nonlocal first
            if not first:  # a failed execute() emptied the queue: queue the same commands again
                for args, kwargs in queued:
                    self.execute_command(*args, **kwargs)
            first = False
            return await super(GatewayClusterPipeline, self).execute(raise_on_error, allow_redirections)

        async with self.cluster_client.slot():
            return await self.cluster_client.reconnect.call_with_retry(run, _ignore)


async def _ignore(error: Exception) -> None:
    """The failure callback: redis-py's cluster client already dropped the connection and refreshed its slot map."""
