"""One job's view of the cache: its trajectory and gradient queues, policy store and learner registry."""

from __future__ import annotations

from collections.abc import Sequence

import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache.codec import DEFAULT_MAX_BYTES
from cache.keys import JobKeys
from cache.learner_registry import LearnerRegistry
from cache.policy_store import PolicyStore
from cache.records import GradientRecord, LearnerTask, TrajectoryBatch
from cache.streams import BoundedStream, Entry


class JobLimits(BaseSettings):
    """Every bound of a job's cache footprint; all configurable, also from STELLARIS_JOB_<FIELD> env vars (how a
    control plane bounds the instances it starts, e.g. how far serverful actors may run ahead of learners)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="STELLARIS_JOB_")

    trajectory_maxlen: int = Field(default=64, gt=0, description="batches queued or in flight")
    gradient_maxlen: int = Field(default=256, gt=0, description="gradients waiting for aggregation")
    task_maxlen: int = Field(default=4096, gt=0, description="learner tasks queued or in flight")
    keep_versions: int = Field(default=8, gt=0, description="policy versions whose weights are kept")
    ttl_s: float = Field(default=86400.0, gt=0, description="TTL of every job key, refreshed on write")
    retired_grace_s: float = Field(default=60.0, ge=0, description="how long a retired version lingers")
    learner_lease_s: float = Field(default=300.0, gt=0, description="registry entry lifetime of a learner")
    backpressure_timeout_s: float = Field(default=120.0, gt=0, description="producer wait on a full stream")
    payload_bytes_max: int = Field(default=DEFAULT_MAX_BYTES, gt=0, description="largest decoded payload")


class TrajectoryQueue:
    """Trajectory batches on a stream; the control plane's consumer group forms rounds from them."""

    def __init__(self, stream: BoundedStream, limits: JobLimits) -> None:
        self.stream = stream
        self.limits = limits

    def put(self, batch: TrajectoryBatch, *, timeout_s: float | None = None) -> str:
        return self.stream.add(batch.encode(), timeout_s=self._timeout(timeout_s))

    def take(self, consumer: str, *, count: int = 1, block_s: float = 0.0) -> list[tuple[str, TrajectoryBatch]]:
        return self._decode(self.stream.read(consumer, count=count, block_s=block_s))

    def get(self, batch_id: str) -> TrajectoryBatch | None:
        entry = self.stream.get(batch_id)
        return None if entry is None else self._decode([entry])[0][1]

    def ack(self, batch_ids: Sequence[str]) -> int:
        return self.stream.ack(batch_ids)

    def reclaim(self, consumer: str, *, min_idle_s: float, count: int = 16) -> list[tuple[str, TrajectoryBatch]]:
        return self._decode(self.stream.reclaim(consumer, min_idle_s=min_idle_s, count=count))

    def _decode(self, entries: list[Entry]) -> list[tuple[str, TrajectoryBatch]]:
        return [(e.id, TrajectoryBatch.decode(e.payload, max_bytes=self.limits.payload_bytes_max)) for e in entries]

    def _timeout(self, timeout_s: float | None) -> float:
        return self.limits.backpressure_timeout_s if timeout_s is None else timeout_s


class GradientQueue:
    """Gradients on a stream with the parameter function's consumer group."""

    def __init__(self, stream: BoundedStream, limits: JobLimits) -> None:
        self.stream = stream
        self.limits = limits

    def put(
        self,
        record: GradientRecord,
        *,
        ack: tuple[BoundedStream, Sequence[str]] | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """Push a gradient; `ack` releases the consumed input entries in the same atomic step."""
        timeout = self.limits.backpressure_timeout_s if timeout_s is None else timeout_s
        return self.stream.add(record.encode(), timeout_s=timeout, ack=ack)

    def take(self, consumer: str, *, count: int = 64, block_s: float = 0.0) -> list[tuple[str, GradientRecord]]:
        return self._decode(self.stream.read(consumer, count=count, block_s=block_s))

    def queued(self, consumer: str, *, count: int = 1024) -> list[tuple[str, GradientRecord]]:
        """Everything waiting for `consumer`: gradients it deferred earlier, then new ones; oldest first."""
        entries = self.stream.read_pending(consumer, count=count)
        entries += self.stream.read(consumer, count=count)
        return self._decode(entries)

    def reclaim(self, consumer: str, *, min_idle_s: float, count: int = 64) -> list[tuple[str, GradientRecord]]:
        return self._decode(self.stream.reclaim(consumer, min_idle_s=min_idle_s, count=count))

    def ack(self, ids: Sequence[str]) -> int:
        return self.stream.ack(ids)

    def _decode(self, entries: list[Entry]) -> list[tuple[str, GradientRecord]]:
        return [(e.id, GradientRecord.decode(e.payload, max_bytes=self.limits.payload_bytes_max)) for e in entries]


class JobCache:
    """Everything one training job keeps in Redis, under its own key namespace."""

    def __init__(self, client: redis.Redis, job: str, limits: JobLimits | None = None) -> None:
        self.client = client
        self.keys = JobKeys(job)
        self.limits = limits or JobLimits()
        lim = self.limits
        self.trajectories = TrajectoryQueue(
            BoundedStream(client, self.keys.traj, group="rounds", maxlen=lim.trajectory_maxlen, ttl_s=lim.ttl_s),
            lim,
        )
        self.gradients = GradientQueue(
            BoundedStream(client, self.keys.grad, group="parameter", maxlen=lim.gradient_maxlen, ttl_s=lim.ttl_s),
            lim,
        )
        self.tasks = BoundedStream(client, self.keys.tasks, group="learners", maxlen=lim.task_maxlen, ttl_s=lim.ttl_s)
        self.policies = PolicyStore(
            client,
            self.keys,
            keep_versions=lim.keep_versions,
            ttl_s=lim.ttl_s,
            retired_grace_s=lim.retired_grace_s,
        )
        self.learners = LearnerRegistry(client, self.keys, lease_s=lim.learner_lease_s, ttl_s=lim.ttl_s)

    def enqueue_tasks(self, tasks: Sequence[LearnerTask], *, timeout_s: float | None = None) -> list[str]:
        timeout = self.limits.backpressure_timeout_s if timeout_s is None else timeout_s
        return [self.tasks.add(t.encode(), timeout_s=timeout) for t in tasks]

    def set_spec(self, spec_json: str) -> None:
        self.client.set(self.keys.spec, spec_json, px=int(self.limits.ttl_s * 1000))

    def spec(self) -> str | None:
        raw = self.client.get(self.keys.spec)
        return None if raw is None else raw.decode()

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
