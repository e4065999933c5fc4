"""The replay pattern (and its store) by name."""

from __future__ import annotations

from cache.keys import JobKeys
from cache.redis_types import RedisClient
from cache.replay.fifo import Fifo
from cache.replay.full_batch import FullBatch
from cache.replay.pattern import ReplayPattern
from cache.replay.prioritized import Prioritized
from cache.replay.store import ReplayStore
from cache.replay.uniform import Uniform
from contract.replay import ReplaySettings

PATTERNS: dict[str, type[ReplayPattern]] = {p.name: p for p in (FullBatch, Fifo, Uniform, Prioritized)}


def make_pattern(
    settings: ReplaySettings, client: RedisClient, keys: JobKeys, *, seed: int = 0, ttl_s: float = 86400.0
) -> ReplayPattern:
    """The pattern `settings.replay` over the job's store; full_batch gets no store (it writes no replay key)."""
    cls = PATTERNS[settings.replay]
    if cls is FullBatch:
        return FullBatch(None, settings, seed=seed)
    per_actor = settings.replay_per_actor if cls is Fifo else None
    store = ReplayStore(
        client,
        keys,
        capacity=settings.replay_capacity,
        bytes_max=settings.bytes_max,
        per_actor=per_actor or (settings.replay_capacity if cls is Fifo else None),
        prioritized=cls.prioritized,
        ttl_s=ttl_s,
    )
    return cls(store, settings, seed=seed)
