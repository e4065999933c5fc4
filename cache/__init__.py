"""cache package."""

from cache.connection import Cache, CacheSettings, connect
from cache.job import JobCache, JobLimits
from cache.tasks import Claim, TaskBoard
from contract.errors import (
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
from contract.records import BatchMeta, GradientMeta, GradientRecord, LearnerTask, TrajectoryBatch

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
