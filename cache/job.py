"""One job's view of the cache: its trajectory and gradient queues, policy store and learner registry."""

from __future__ import annotations

import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache.aggregator import AggregatorStore
from cache.dead_letters import DeadLetters
from cache.keys import JobKeys
from cache.learner_registry import LearnerRegistry
from cache.policy_store import PolicyStore
from cache.redis_types import RedisClient, text
from cache.replay.store import ReplayStore
from cache.streams import BoundedStream
from cache.tasks import GradientStream, TaskBoard
from cache.trajectories import TrajectoryQueue
from contract.codec import DEFAULT_MAX_BYTES


class JobLimits(BaseSettings):
    """Every bound of a job's cache footprint; all configurable, also from STELLARIS_JOB_<FIELD> env vars (how a
    control plane bounds the instances it starts, e.g. how far serverful actors may run ahead of learners)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="STELLARIS_JOB_")

    trajectory_maxlen: int = Field(default=64, gt=0, description="batches queued or in flight")
    gradient_maxlen: int = Field(default=256, gt=0, description="gradients waiting for aggregation")
    task_maxlen: int = Field(default=4096, gt=0, description="learner tasks queued or in flight")
    keep_versions: int = Field(default=8, gt=0, description="policy versions whose weights are kept")
    ttl_s: float = Field(default=86400.0, gt=0, description="TTL of every job key, refreshed on write")
    retired_grace_s: float = Field(default=60.0, ge=0, description="how long a retired version a learner holds lingers")
    learner_lease_s: float = Field(
        default=5.0, gt=0, description="a learner's lease, refreshed while it lives; its tasks are taken over after"
    )
    parameter_lease_s: float = Field(
        default=5.0, gt=0, description="the parameter function's update lease, refreshed while it lives"
    )
    max_attempts: int = Field(default=3, gt=0, description="deliveries of a task before it is dead-lettered")
    dead_letter_maxlen: int = Field(default=10_000, gt=0, description="dead letters kept (oldest trimmed)")
    applied_maxlen: int = Field(default=100_000, gt=0, description="aggregation records kept for the control plane")
    optimizer_save_every: int = Field(
        default=16,
        ge=1,
        le=1_000_000,
        description="updates between stores of the optimizer state (and always when an update invocation ends)",
    )
    backpressure_timeout_s: float = Field(default=120.0, gt=0, description="producer wait on a full stream")
    payload_bytes_max: int = Field(default=DEFAULT_MAX_BYTES, gt=0, description="largest decoded payload")


class JobCache:
    """Everything one training job keeps in Redis, under its own key namespace."""

    def __init__(self, client: RedisClient, job: str, limits: JobLimits | None = None) -> None:
        self.client = client
        self.keys = JobKeys(job)
        self.limits = limits or JobLimits()
        lim = self.limits
        self.trajectories = TrajectoryQueue(
            BoundedStream(client, self.keys.traj, group="rounds", maxlen=lim.trajectory_maxlen, ttl_s=lim.ttl_s),
            ReplayStore(client, self.keys, ttl_s=lim.ttl_s),
            backpressure_timeout_s=lim.backpressure_timeout_s,
            payload_bytes_max=lim.payload_bytes_max,
        )
        self.gradients = GradientStream(
            client, self.keys.grad, payload_bytes_max=lim.payload_bytes_max, version_key=self.keys.policy_version
        )
        self.board = TaskBoard(
            client,
            self.keys,
            maxlen=lim.task_maxlen,
            ttl_s=lim.ttl_s,
            lease_s=lim.learner_lease_s,
            max_attempts=lim.max_attempts,
            dead_letter_maxlen=lim.dead_letter_maxlen,
            gradient_maxlen=lim.gradient_maxlen,
        )
        self.policies = PolicyStore(
            client,
            self.keys,
            keep_versions=lim.keep_versions,
            ttl_s=lim.ttl_s,
            retired_grace_s=lim.retired_grace_s,
        )
        self.learners = LearnerRegistry(client, self.keys, lease_s=lim.learner_lease_s, ttl_s=lim.ttl_s)
        self.aggregator = AggregatorStore(client, self.keys, ttl_s=lim.ttl_s)
        self.dead_letters = DeadLetters(client, self.keys, maxlen=lim.dead_letter_maxlen, ttl_s=lim.ttl_s)

    def set_spec(self, spec_json: str) -> None:
        self.client.set(self.keys.spec, spec_json, px=int(self.limits.ttl_s * 1000))

    def spec(self) -> str | None:
        raw = self.client.get(self.keys.spec)
        return None if raw is None else text(raw)

    def data_lost(self) -> bool:
        """Whether the cache answers but no longer holds the job's policy version, which the job writes when it is
        created and with every update: its data is gone (a Redis restarted empty, or flushed). False when the cache
        does not answer (that says nothing about the data)."""
        try:
            return not self.client.exists(self.keys.policy_version)
        except redis.RedisError:
            return False

    def stop_round(self, round_k: int) -> None:
        """End round `round_k`'s invocations early (the control plane stops mid-round): the round is marked closed,
        so learners leave once the tasks already enqueued are done, and the parameter function is told to stop."""
        self.board.close(round_k)
        ttl_ms = int(self.limits.ttl_s * 1000)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xadd(self.keys.control, {"event": "stop"}, maxlen=64, approximate=True)
            pipe.pexpire(self.keys.control, ttl_ms)
            pipe.execute()

    def delete(self) -> int:
        """Remove this job's keys only (never FLUSHALL): SCAN the job's namespace and UNLINK in batches."""
        removed = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.keys.pattern(), count=500):
            batch.append(key)
            if len(batch) >= 500:
                removed += int(self.client.unlink(*batch))
                batch.clear()
        if batch:
            removed += int(self.client.unlink(*batch))
        return removed
