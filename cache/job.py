"""One job's view of the cache: its trajectory and gradient queues, policy store and learner registry."""

from __future__ import annotations

from collections.abc import Sequence

import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache.aggregator import AggregatorStore
from cache.dead_letters import DeadLetters
from cache.keys import JobKeys
from cache.learner_registry import LearnerRegistry
from cache.policy_store import PolicyStore
from cache.redis_types import RedisClient, read_entries, text
from cache.replay.store import ReplayStore, is_replay_id
from cache.streams import MAX_BLOCK_S, BoundedStream, Entry
from cache.tasks import TaskBoard
from contract.batch_checks import version_ahead
from contract.codec import DEFAULT_MAX_BYTES, encode_fields
from contract.errors import FencingError, RecordError
from contract.records import BatchMeta, GradientMeta, GradientRecord, TrajectoryBatch


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
        default=16, ge=1, le=1_000_000,
        description="updates between stores of the optimizer state (and always when an update invocation ends)",
    )  # fmt: skip
    backpressure_timeout_s: float = Field(default=120.0, gt=0, description="producer wait on a full stream")
    payload_bytes_max: int = Field(default=DEFAULT_MAX_BYTES, gt=0, description="largest decoded payload")


class TrajectoryQueue:
    """Trajectory batches on a stream; the control plane's consumer group forms rounds from them, reading each
    batch's header only. Learners read a batch's arrays by id."""

    def __init__(self, stream: BoundedStream, limits: JobLimits, replay: ReplayStore | None = None) -> None:
        self.stream = stream
        self.limits = limits
        self.replay = replay  # where replayed batches (ids `r<stream id>`, cache/replay) are read from

    def put(self, batch: TrajectoryBatch, *, timeout_s: float | None = None) -> str:
        timeout = self.limits.backpressure_timeout_s if timeout_s is None else timeout_s
        return self.stream.add(batch.fields(), timeout_s=timeout)

    def put_header(self, meta: BatchMeta, *, timeout_s: float | None = None) -> str:
        """A batch's header without its arrays (the gradients_at_actors profile: the control plane counts it)."""
        timeout = self.limits.backpressure_timeout_s if timeout_s is None else timeout_s
        return self.stream.add(encode_fields({}, meta.to_dict()), timeout_s=timeout)

    def take(self, consumer: str, *, count: int = 1, block_s: float = 0.0) -> list[tuple[str, BatchMeta]]:
        """New batches for `consumer`: ids and headers (no array is decoded)."""
        return [
            (e.id, BatchMeta.from_fields(e.fields)) for e in self.stream.read(consumer, count=count, block_s=block_s)
        ]

    def get(self, batch_id: str) -> TrajectoryBatch | None:
        if self.replay is not None and is_replay_id(batch_id):
            fields = self.replay.read(batch_id)
            return (
                None if fields is None else TrajectoryBatch.from_fields(fields, max_bytes=self.limits.payload_bytes_max)
            )
        entry = self.stream.get(batch_id)
        if entry is None:
            return None
        return TrajectoryBatch.from_fields(entry.fields, max_bytes=self.limits.payload_bytes_max)

    def ack(self, batch_ids: Sequence[str]) -> int:
        return self.stream.ack(batch_ids)

    def reclaim(self, consumer: str, *, min_idle_s: float, count: int = 16) -> list[tuple[str, BatchMeta]]:
        entries = self.stream.reclaim(consumer, min_idle_s=min_idle_s, count=count)
        return [(e.id, BatchMeta.from_fields(e.fields)) for e in entries]


class GradientStream:
    """Gradients waiting for the parameter function, in arrival order. It is their only reader (it holds the
    update lease), so the stream needs no consumer group: entries are deleted in the same atomic step that
    publishes the version they went into (`PolicyStore.publish_and_ack`)."""

    def __init__(self, client: RedisClient, key: str, limits: JobLimits, *, version_key: str | None = None) -> None:
        self.client = client
        self.key = key
        self.limits = limits
        self.version_key = version_key  # the job's newest published policy version

    def read(self, after: str = "0-0", *, count: int = 1024, block_s: float = 0.0) -> list[Entry]:
        """Entries newer than `after`, blocking up to `block_s` when there are none."""
        block_ms = int(min(block_s, MAX_BLOCK_S) * 1000)
        reply = self.client.xread({self.key: after}, count=count, block=block_ms or None)
        return [Entry(i, f) for i, f in read_entries(reply)]

    def meta(self, entry: Entry, *, held: int | None = None) -> GradientMeta:
        """The entry's header. With `held`, the version its reader (the update lease's holder) last published: a base
        version past it that the store never published either is `RecordError` (poison: no learner can have held
        it), and a store that has moved past `held` is `FencingError` (another holder published)."""
        meta = GradientMeta.from_fields(entry.fields)
        if held is None or version_ahead(meta.base_version, held, "") is None or self.version_key is None:
            return meta
        published = int(self.client.get(self.version_key) or 0)
        if published > held:
            raise FencingError(f"policy version {published} was published by another holder; the reader holds {held}")
        raise RecordError(str(version_ahead(meta.base_version, published, f"gradient {meta.task_id!r}: base version")))

    def record(self, entry: Entry) -> GradientRecord:
        return GradientRecord.from_fields(entry.fields, max_bytes=self.limits.payload_bytes_max)

    def length(self) -> int:
        return int(self.client.xlen(self.key))

    def put(self, record: GradientRecord) -> str:
        """Append outside the task protocol (tests, tools); learners use `TaskBoard.complete`."""
        return text(self.client.xadd(self.key, dict(_pairs(record.fields()))))


def _pairs(flat: Sequence[bytes | memoryview]) -> list[tuple[bytes, bytes | memoryview]]:
    return [(bytes(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


class JobCache:
    """Everything one training job keeps in Redis, under its own key namespace."""

    def __init__(self, client: RedisClient, job: str, limits: JobLimits | None = None) -> None:
        self.client = client
        self.keys = JobKeys(job)
        self.limits = limits or JobLimits()
        lim = self.limits
        self.trajectories = TrajectoryQueue(
            BoundedStream(client, self.keys.traj, group="rounds", maxlen=lim.trajectory_maxlen, ttl_s=lim.ttl_s),
            lim,
            ReplayStore(client, self.keys, ttl_s=lim.ttl_s),
        )
        self.gradients = GradientStream(client, self.keys.grad, lim, version_key=self.keys.policy_version)
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
