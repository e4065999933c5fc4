"""Typed failures of the cache layer: callers catch these, never bare redis errors."""

from __future__ import annotations


class CacheError(RuntimeError):
    """Base class of every error raised by `cache/`."""


class CodecError(CacheError, ValueError):
    """A buffer is malformed, truncated, oversized, or does not match its header."""


class RedisServerDied(CacheError):
    """The embedded redis-server exited; the message is `headline` (which process, how it ended) and the tail of its
    log."""

    def __init__(self, headline: str, log_tail: str = "") -> None:
        super().__init__(f"{headline}; last log lines:\n{log_tail}")
        self.headline = headline
        self.log_tail = log_tail


class JobDataLost(CacheError):
    """The job's data is gone from the cache (Redis restarted without persistence, or was flushed) under a call that
    was working on it. The control plane reports the loss, once, and resumes from its checkpoint in a new epoch; the
    functions of the dead epoch say no more than this (no traceback)."""


class RedisStartError(CacheError):
    """The embedded redis-server could not be started."""


class BackpressureTimeout(CacheError):
    """A bounded stream stayed full for the whole wait: consumers are not keeping up."""


class VersionNotFound(CacheError, KeyError):
    """A policy version is not (or no longer) in the store."""


class FencingError(CacheError):
    """A writer lost its update lease, or the version moved under it: the write was refused."""


class LeaseUnavailable(CacheError):
    """Another owner holds the update lease."""


class RecordError(CacheError, ValueError):
    """A record read from the cache, or about to be written, is inconsistent."""
