"""Connecting to the cache: `REDIS_URL` when given, else a private embedded redis-server.

A `redis+cluster://` or `rediss+cluster://` URL names one node of a Redis Cluster: the cache then uses cluster
clients (cache/cluster_client.py), with the same round-trip count, retry window, connect hooks and pool bound (per
node).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.cluster
import redis.retry
from pydantic import BaseModel, ConfigDict, Field
from redis.backoff import NoBackoff

from cache.acl import url_as
from cache.cluster_client import CLUSTER_RETRY_ON, CLUSTER_SCHEMES, GuardedCluster, is_cluster_url, node_url
from cache.redis_types import RedisClient
from cache.retry import ReconnectRetry, window_from_env
from cache.server import EmbeddedRedis
from contract.errors import CacheError, RedisServerDied
from host.allocator import tune_allocator

REDIS_URL_ENV = "REDIS_URL"
# A per-job user's credentials (cache/acl.py), applied over $REDIS_URL: the deployment says where Redis is, the job
# says who its functions are there.
REDIS_USER_ENV, REDIS_PASSWORD_ENV = "STELLARIS_REDIS_USER", "STELLARIS_REDIS_PASSWORD"
SCHEMES = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)


class CacheSettings(BaseModel):
    """How to reach Redis and the bounds of the embedded server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(
        default=None,
        description="redis://, rediss://, unix:// or (a cluster) redis+cluster:// URL; None starts an embedded server",
    )
    maxmemory_bytes: int = Field(default=2 * 1024**3, gt=0, description="embedded server memory cap")
    socket_timeout_s: float = Field(default=60.0, gt=0, description="per-command socket timeout")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=64, gt=0, description="connection pool bound per client")
    tune_allocator: bool = Field(default=True, description="keep freed large buffers in the heap (glibc)")
    reconnect_window_s: float = Field(
        default_factory=window_from_env,
        ge=0,
        le=86_400,
        description="how long a command retries across a lost connection or a Redis restart (0: never)",
    )


class _CountedPipeline(redis.client.Pipeline):
    """A pipeline that counts its execution as one round trip on the client that made it."""

    def __init__(self, *args: Any, owner: _GuardedRedis, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.command_stack:
            self._owner.round_trips += 1
        return super().execute(raise_on_error)


class _GuardedRedis(redis.Redis):
    """A client that counts its round trips to the server (`round_trips`: a command, a script, or a whole pipeline
    each count one). A dead embedded server is reported by the retry policy's check (`RedisServerDied`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips = 0  # approximate under threads (+= is not atomic); a measure, not an invariant

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return _CountedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint, owner=self)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return super().execute_command(*args, **options)


class Cache:
    """A Redis client plus, for the embedded default, the server it owns. Close it (or use `with`)."""

    def __init__(self, settings: CacheSettings | None = None) -> None:
        self.settings = settings or CacheSettings(url=os.environ.get(REDIS_URL_ENV) or None)
        self.server: EmbeddedRedis | None = None
        if self.settings.tune_allocator:
            tune_allocator()
        url = self.settings.url
        if url is None:
            self.server = EmbeddedRedis(maxmemory_bytes=self.settings.maxmemory_bytes, unix_socket=True).start()
            url = self.server.url
        elif not url.startswith(SCHEMES):
            accepted = f"{', '.join(SCHEMES[:-1])} or {SCHEMES[-1]}"
            raise CacheError(f"REDIS_URL must start with {accepted}, got {redact_url(url)!r}")
        # `url` reaches the server from anywhere it can be reached (loopback TCP for an embedded one); `local_url`
        # from this machine only, faster where the embedded server has a socket file: ours and local processes'.
        self.url = url
        self.local_url = self.server.local_url if self.server is not None else url
        self.cluster = is_cluster_url(url)
        # One retry policy for every client of this cache; it arms once the server has been reached, so a wrong URL
        # or password fails at once while a restart later on is ridden out.
        self.retry = ReconnectRetry(
            self.settings.reconnect_window_s,
            check=self.server.raise_if_dead if self.server is not None else None,
            errors=CLUSTER_RETRY_ON if self.cluster else (redis.ConnectionError,),
        )
        self._connect_hooks: list[Callable[[redis.connection.AbstractConnection], None]] = []
        try:
            self.client: RedisClient = self._client(self.local_url)
            self.client.ping()
            if isinstance(self.client, redis.Redis):  # a single server: not self.cluster
                _refuse_a_cluster_node(self.client)
        except (redis.RedisError, redis.cluster.RedisClusterException, ValueError) as exc:
            self.close()
            kind = "Redis Cluster" if self.cluster else "Redis"
            raise CacheError(f"cannot reach {kind} at {redact_url(url)}: {exc}") from exc
        self.retry.armed = True

    def _client(self, url: str) -> RedisClient:
        if self.cluster:
            # The pool bound is per node. redis-py's own retries are off (it would resend a timed-out command, up to
            # 10 times): `reconnect` is the one retry policy, as for a single server.
            return GuardedCluster.from_url(
                node_url(url),
                reconnect=self.retry,
                retry=redis.retry.Retry(NoBackoff(), 0),
                socket_timeout=self.settings.socket_timeout_s,
                socket_connect_timeout=self.settings.connect_timeout_s,
                max_connections=self.settings.max_connections,
                redis_connect_func=self._run_hooks,  # RedisCluster runs the handshake itself, then this
            )
        pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=self.settings.socket_timeout_s,
            socket_connect_timeout=self.settings.connect_timeout_s,
            max_connections=self.settings.max_connections,
            health_check_interval=30,
            retry=self.retry,
            redis_connect_func=self._connected,
        )
        return _GuardedRedis(connection_pool=pool)

    def _connected(self, conn: redis.connection.AbstractConnection) -> None:
        conn.on_connect()
        self._run_hooks(conn)

    def _run_hooks(self, conn: redis.connection.AbstractConnection) -> None:
        for hook in self._connect_hooks:
            hook(conn)

    def on_connect(self, hook: Callable[[redis.connection.AbstractConnection], None], *, remove: bool = False) -> None:
        """Run `hook(connection)` on every new connection of this cache's clients from now on (after a restart, every
        connection is new); `remove` stops it."""
        if not remove:
            self._connect_hooks.append(hook)
        elif hook in self._connect_hooks:
            self._connect_hooks.remove(hook)

    @property
    def round_trips(self) -> int:
        """Round trips this cache's client made so far."""
        return int(getattr(self.client, "round_trips", 0))

    def new_client(self) -> RedisClient:
        """A separate client (own pool) on the same server or cluster, e.g. for a thread that blocks on reads."""
        return self._client(self.local_url)

    def server_died(self) -> bool:
        """Whether this cache's embedded server exited on its own: everything in it is gone, so there is nothing
        left for anyone to finish (an external server may come back, and is never reported here)."""
        return self.server is not None and not self.server.is_alive()

    def server_death(self) -> RedisServerDied | None:
        """How the embedded server died (its exit and log tail), while it is still ours to ask; None while it runs,
        or for an external server."""
        try:
            if self.server is not None:
                self.server.raise_if_dead()
        except RedisServerDied as died:
            return died
        return None

    def close(self) -> None:
        client = getattr(self, "client", None)
        if isinstance(client, redis.cluster.RedisCluster):
            client.close()
            client.disconnect_connection_pools()
        elif client is not None:
            client.close()
            client.connection_pool.disconnect()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> Cache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _refuse_a_cluster_node(client: redis.Redis) -> None:
    """A plain URL that names a Redis Cluster node would fail later, key by key, with MOVED: say so now. (A job's
    user may not run INFO; it gets the URL its owner checked.)"""
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except redis.ResponseError:
        return
    if enabled:
        raise ValueError("it is a Redis Cluster node: use a redis+cluster:// (or rediss+cluster://) URL")


def redact_url(url: str) -> str:
    """The URL without its password, for error messages."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def credentials_env(url: str) -> dict[str, str]:
    """The credentials in `url` as an instance's environment names them (`connect` puts them back in the URL), for a
    registration that must reach the cache as the URL's user; empty when it has no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return {}
    return {REDIS_USER_ENV: unquote(parts.username or "default"), REDIS_PASSWORD_ENV: unquote(parts.password)}


def connect(url: str | None = None, **settings: Any) -> Cache:
    """Open the cache: `url`, else `$REDIS_URL` (as $STELLARIS_REDIS_USER when that and its password are set), else a
    private embedded redis-server."""
    url = url or os.environ.get(REDIS_URL_ENV) or None
    user, password = os.environ.get(REDIS_USER_ENV), os.environ.get(REDIS_PASSWORD_ENV)
    if url and user and password:
        url = url_as(url, user, password)
    return Cache(CacheSettings(url=url, **settings))
