"""The cache tests run against a single redis-server and against a 3-master Redis Cluster: `cache_conn` (and so
`job`) is parametrized, and each test id says which ([single] or [cluster])."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cache import Cache, CacheSettings
from cache.cluster_server import EmbeddedRedisCluster
from cache.server import EmbeddedRedis


@pytest.fixture(scope="session", params=["single", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> EmbeddedRedis | EmbeddedRedisCluster:
    """The server the cache tests run against (both have `url`, `password` and their processes' ids)."""
    return request.getfixturevalue("redis_server" if request.param == "single" else "redis_cluster")


@pytest.fixture(scope="session")
def cache_conn(redis_target: EmbeddedRedis | EmbeddedRedisCluster) -> Iterator[Cache]:
    with Cache(CacheSettings(url=redis_target.url)) as cache:
        yield cache
