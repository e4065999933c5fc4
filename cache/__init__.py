"""cache package."""

from cache.connection import Cache, CacheSettings, connect
from cache.errors import (
    BackpressureTimeout,
    CacheError,
    CodecError,
    FencingError,
    JobDataLost,
    LeaseUnavailable,
    RecordError,
    RedisServerDied,
    VersionNotFound,
)
from cache.job import JobCache, JobLimits
from cache.records import BatchMeta, GradientMeta, GradientRecord, LearnerTask, TrajectoryBatch
from cache.tasks import Claim, TaskBoard

__all__ = [
    "BackpressureTimeout",
    "BatchMeta",
    "Cache",
    "CacheError",
    "CacheSettings",
    "Claim",
    "CodecError",
    "FencingError",
    "GradientMeta",
    "GradientRecord",
    "JobCache",
    "JobDataLost",
    "JobLimits",
    "LearnerTask",
    "LeaseUnavailable",
    "RecordError",
    "RedisServerDied",
    "TaskBoard",
    "TrajectoryBatch",
    "VersionNotFound",
    "connect",
]
