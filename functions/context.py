"""What a handler sees besides its event: the cache, its call id, a logger, and warm per-instance state."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cache import Cache, JobCache
from cache import connect as connect_cache


class Instance:
    """Lives as long as the warm instance: one cache connection and memo for reuse across invocations.

    The cache connects on first use (`connect`, by default `$REDIS_URL` else an embedded server), so a handler that
    never touches it never starts a redis-server. Handlers may run on several threads, hence the lock.
    """

    def __init__(
        self,
        cache: Cache | None = None,
        memo: dict[str, Any] | None = None,
        jobs: dict[str, JobCache] | None = None,
        *,
        connect: Callable[[], Cache] = connect_cache,
    ) -> None:
        self._cache = cache
        self._connect = connect
        self._lock = threading.Lock()
        self.memo: dict[str, Any] = {} if memo is None else memo  # e.g. env vectors, the policy last loaded
        self.jobs: dict[str, JobCache] = {} if jobs is None else jobs

    @property
    def cache(self) -> Cache:
        with self._lock:
            if self._cache is None:
                self._cache = self._connect()
            return self._cache

    @property
    def cache_opened(self) -> bool:
        return self._cache is not None

    def job(self, job_id: str) -> JobCache:
        cache = self.cache
        with self._lock:
            if job_id not in self.jobs:
                self.jobs[job_id] = JobCache(cache.client, job_id)
            return self.jobs[job_id]

    def close(self) -> None:
        """Close the cache if it was opened (stops an embedded server); a later use reconnects."""
        with self._lock:
            cache, self._cache = self._cache, None
            self.jobs.clear()
        if cache is not None:
            cache.close()


@dataclass
class Context:
    """Per invocation."""

    call_id: str
    instance: Instance
    log: logging.LoggerAdapter = field(init=False)

    def __post_init__(self) -> None:
        self.log = logging.LoggerAdapter(logging.getLogger("stellaris.function"), {"call_id": self.call_id})

    def job(self, job_id: str) -> JobCache:
        return self.instance.job(job_id)

    @property
    def memo(self) -> dict[str, Any]:
        return self.instance.memo
