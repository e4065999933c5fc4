"""The records that travel through the cache, and their conversion to and from the wire format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cache.codec import DEFAULT_MAX_BYTES, Frame, decode, encode
from cache.errors import CodecError, RecordError

# Arrays every trajectory batch carries, time-major: [T, N, ...] for T steps of N envs.
TRAJECTORY_ARRAYS = (
    "observations",
    "actions",
    "rewards",
    "terminations",
    "truncations",
    "behaviour_log_probs",
    "values",
)


def _int(meta: Mapping[str, Any], key: str, what: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"{what}: field {key!r} must be an int, got {value!r}")
    return value


def _str(meta: Mapping[str, Any], key: str, what: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str):
        raise RecordError(f"{what}: field {key!r} must be a string, got {value!r}")
    return value


def _decode(payload: bytes, what: str, max_bytes: int) -> Frame:
    try:
        return decode(payload, max_bytes=max_bytes)
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from exc


@dataclass(frozen=True)
class TrajectoryBatch:
    """One actor's batch of env steps, collected with behaviour policy version μ."""

    actor_id: str
    behaviour_version: int
    env_steps: int
    arrays: Mapping[str, Any]
    info: Mapping[str, Any] = field(default_factory=dict)  # e.g. finished episode returns

    def __post_init__(self) -> None:
        missing = [k for k in TRAJECTORY_ARRAYS if k not in self.arrays]
        if missing:
            raise RecordError(f"trajectory batch from {self.actor_id!r} lacks arrays {missing}")
        lead = {k: tuple(np.shape(self.arrays[k])[:1]) for k in TRAJECTORY_ARRAYS}
        if len(set(lead.values())) != 1:
            raise RecordError(f"trajectory batch from {self.actor_id!r}: arrays disagree on length: {lead}")
        if self.env_steps < 0 or self.behaviour_version < 0:
            raise RecordError("trajectory batch: env_steps and behaviour_version must be non-negative")

    def encode(self) -> bytes:
        meta = {
            "kind": "trajectory",
            "actor_id": self.actor_id,
            "behaviour_version": self.behaviour_version,
            "env_steps": self.env_steps,
            "info": dict(self.info),
        }
        return encode(self.arrays, meta)

    @classmethod
    def decode(cls, payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> TrajectoryBatch:
        what = "trajectory batch"
        frame = _decode(payload, what, max_bytes)
        if frame.meta.get("kind") != "trajectory":
            raise RecordError(f"{what}: payload kind is {frame.meta.get('kind')!r}, not 'trajectory'")
        info = frame.meta.get("info", {})
        return cls(
            actor_id=_str(frame.meta, "actor_id", what),
            behaviour_version=_int(frame.meta, "behaviour_version", what),
            env_steps=_int(frame.meta, "env_steps", what),
            arrays=frame.arrays,
            info=info if isinstance(info, dict) else {},
        )


@dataclass(frozen=True)
class GradientRecord:
    """One learner's gradient, computed against policy version `base_version` from the named batches."""

    learner_id: str
    base_version: int
    batch_ids: tuple[str, ...]
    tensors: Mapping[str, Any]
    stats: Mapping[str, Any] = field(default_factory=dict)  # losses, truncation fraction, mean IS weight

    def __post_init__(self) -> None:
        if self.base_version < 0:
            raise RecordError(f"gradient from {self.learner_id!r}: base_version must be non-negative")
        if not self.tensors:
            raise RecordError(f"gradient from {self.learner_id!r} has no tensors")

    def encode(self) -> bytes:
        meta = {
            "kind": "gradient",
            "learner_id": self.learner_id,
            "base_version": self.base_version,
            "batch_ids": list(self.batch_ids),
            "stats": dict(self.stats),
        }
        return encode(self.tensors, meta)

    @classmethod
    def decode(cls, payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> GradientRecord:
        what = "gradient"
        frame = _decode(payload, what, max_bytes)
        if frame.meta.get("kind") != "gradient":
            raise RecordError(f"{what}: payload kind is {frame.meta.get('kind')!r}, not 'gradient'")
        ids = frame.meta.get("batch_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RecordError(f"{what}: field 'batch_ids' must be a list of strings, got {ids!r}")
        stats = frame.meta.get("stats", {})
        return cls(
            learner_id=_str(frame.meta, "learner_id", what),
            base_version=_int(frame.meta, "base_version", what),
            batch_ids=tuple(ids),
            tensors=frame.tensors(),
            stats=stats if isinstance(stats, dict) else {},
        )


@dataclass(frozen=True)
class LearnerTask:
    """One (epoch, minibatch) of a round over the round's trajectory batches (SPEC.md §5); one gradient each."""

    round: int
    batch_ids: tuple[str, ...]
    epoch: int
    minibatch: int
    num_minibatches: int

    def encode(self) -> bytes:
        return encode({}, {"kind": "task", **self.meta()})

    def meta(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "batch_ids": list(self.batch_ids),
            "epoch": self.epoch,
            "minibatch": self.minibatch,
            "num_minibatches": self.num_minibatches,
        }

    @classmethod
    def decode(cls, payload: bytes) -> LearnerTask:
        meta = _decode(payload, "learner task", 1024 * 1024).meta
        what = "learner task"
        ids = meta.get("batch_ids")
        if meta.get("kind") != "task" or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RecordError(f"{what}: not a task record: {meta!r}")
        task = cls(
            round=_int(meta, "round", what),
            batch_ids=tuple(ids),
            epoch=_int(meta, "epoch", what),
            minibatch=_int(meta, "minibatch", what),
            num_minibatches=_int(meta, "num_minibatches", what),
        )
        if not 0 <= task.minibatch < task.num_minibatches:
            raise RecordError(f"{what}: minibatch {task.minibatch} outside 0..{task.num_minibatches - 1}")
        return task
