"""cache package."""

from cache.connection import Cache, CacheSettings, connect
from cache.errors import (
    BackpressureTimeout,
    CacheError,
    CodecError,
    FencingError,
    LeaseUnavailable,
    RecordError,
    RedisServerDied,
    VersionNotFound,
)
from cache.job import JobCache, JobLimits
from cache.records import GradientRecord, LearnerTask, TrajectoryBatch

__all__ = [
    "BackpressureTimeout",
    "Cache",
    "CacheError",
    "CacheSettings",
    "CodecError",
    "FencingError",
    "GradientRecord",
    "JobCache",
    "JobLimits",
    "LearnerTask",
    "LeaseUnavailable",
    "RecordError",
    "RedisServerDied",
    "TrajectoryBatch",
    "VersionNotFound",
    "connect",
]
