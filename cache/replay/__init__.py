"""Replay patterns in the cache (full batch, FIFO per actor, uniform ring, prioritised): one interface
(`pattern.ReplayPattern`), one bounded store (`store.ReplayStore`), a factory by name (`buffer.make_pattern`)."""

from cache.replay.buffer import make_pattern
from cache.replay.pattern import ReplayPattern, Sample
from cache.replay.store import REPLAY_PREFIX, ReplayEntry, ReplayStore, is_replay_id, replay_id
from contract.replay import ReplayName, ReplaySettings

__all__ = [
    "REPLAY_PREFIX",
    "ReplayEntry",
    "ReplayName",
    "ReplayPattern",
    "ReplaySettings",
    "ReplayStore",
    "Sample",
    "is_replay_id",
    "make_pattern",
    "replay_id",
]
