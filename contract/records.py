"""The records that travel through the cache, and their conversion to and from the wire format."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.codec import DEFAULT_MAX_BYTES, Frame, decode_fields, decode_fields_meta, encode_fields
from contract.errors import CodecError, RecordError

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


def _frame(fields: Mapping[bytes, bytes], what: str, max_bytes: int) -> Frame:
    try:
        return decode_fields(fields, max_bytes=max_bytes)
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from exc


def _meta(fields: Mapping[bytes, bytes], what: str, kind: str) -> dict[str, Any]:
    try:
        meta = decode_fields_meta(fields)
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from exc
    if meta.get("kind") != kind:
        raise RecordError(f"{what}: entry kind is {meta.get('kind')!r}, not {kind!r}")
    return meta


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

    def fields(self) -> list[bytes | memoryview]:
        meta = BatchMeta(self.actor_id, self.behaviour_version, self.env_steps, self.info)
        return encode_fields(self.arrays, meta.to_dict())

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes], *, max_bytes: int = DEFAULT_MAX_BYTES) -> TrajectoryBatch:
        meta = BatchMeta.from_fields(fields)
        frame = _frame(fields, "trajectory batch", max_bytes)
        return cls(meta.actor_id, meta.behaviour_version, meta.env_steps, frame.arrays, meta.info)


@dataclass(frozen=True)
class BatchMeta:
    """What the control plane needs of a trajectory batch, read from its header alone (no arrays decoded)."""

    actor_id: str
    behaviour_version: int
    env_steps: int
    info: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "trajectory",
            "actor_id": self.actor_id,
            "behaviour_version": self.behaviour_version,
            "env_steps": self.env_steps,
            "info": dict(self.info),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> BatchMeta:
        what = "trajectory batch"
        meta = _meta(fields, what, "trajectory")
        info = meta.get("info", {})
        return cls(
            actor_id=_str(meta, "actor_id", what),
            behaviour_version=_int(meta, "behaviour_version", what),
            env_steps=_int(meta, "env_steps", what),
            info=info if isinstance(info, dict) else {},
        )


@dataclass(frozen=True)
class GradientMeta:
    """A gradient's bookkeeping, stored beside its tensors: decisions are made from this alone."""

    learner_id: str
    base_version: int
    task_id: str
    round: int
    stats: Mapping[str, Any] = field(default_factory=dict)  # losses, truncation fraction, mean IS weight

    def __post_init__(self) -> None:
        if self.base_version < 0:
            raise RecordError(f"gradient from {self.learner_id!r}: base_version must be non-negative")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "gradient",
            "learner_id": self.learner_id,
            "base_version": self.base_version,
            "task_id": self.task_id,
            "round": self.round,
            "stats": dict(self.stats),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> GradientMeta:
        what = "gradient"
        meta = _meta(fields, what, "gradient")
        stats = meta.get("stats", {})
        return cls(
            learner_id=_str(meta, "learner_id", what),
            base_version=_int(meta, "base_version", what),
            task_id=_str(meta, "task_id", what),
            round=_int(meta, "round", what),
            stats=stats if isinstance(stats, dict) else {},
        )


@dataclass(frozen=True)
class ObsMoments:
    """Mean, population variance and count of a round's (encoded) observations, for the running normaliser: a
    learner sends them once per round with a gradient, the parameter function folds them in."""

    mean: Any
    var: Any
    count: float


# A gradient's observation moments travel as two more arrays of its entry (names no parameter has: a module's
# parameter names never contain "/") and their count in the header.
_OBS_MEAN, _OBS_VAR, _OBS_COUNT = "obs_moments/mean", "obs_moments/var", "obs_count"


@dataclass(frozen=True)
class GradientRecord:
    """One learner's gradient for one task, computed against policy version `meta.base_version`, with the round's
    observation moments when the learner sends them."""

    meta: GradientMeta
    tensors: Mapping[str, Any]
    obs_moments: ObsMoments | None = None

    def __post_init__(self) -> None:
        if not self.tensors:
            raise RecordError(f"gradient from {self.meta.learner_id!r} has no tensors")
        if _OBS_MEAN in self.tensors or _OBS_VAR in self.tensors:
            who = self.meta.learner_id
            raise RecordError(f"gradient from {who!r}: tensor names {_OBS_MEAN!r} and {_OBS_VAR!r} are reserved")

    def fields(self) -> list[bytes | memoryview]:
        meta = self.meta.to_dict()
        if self.obs_moments is None:
            return encode_fields(self.tensors, meta)
        m = self.obs_moments
        arrays = {**self.tensors, _OBS_MEAN: m.mean, _OBS_VAR: m.var}
        return encode_fields(arrays, {**meta, _OBS_COUNT: float(m.count)})

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes], *, max_bytes: int = DEFAULT_MAX_BYTES) -> GradientRecord:
        meta = GradientMeta.from_fields(fields)
        frame = _frame(fields, "gradient", max_bytes)
        tensors = frame.tensors()
        mean, var = tensors.pop(_OBS_MEAN, None), tensors.pop(_OBS_VAR, None)
        count = frame.meta.get(_OBS_COUNT)
        if count is None and mean is None and var is None:
            return cls(meta, tensors)
        if mean is None or var is None or not isinstance(count, int | float) or isinstance(count, bool):
            raise RecordError("gradient: observation moments need a mean, a variance and a numeric count")
        return cls(meta, tensors, ObsMoments(mean, var, float(count)))


@dataclass(frozen=True)
class LearnerTask:
    """One (epoch, minibatch) of a round over the round's trajectory batches (docs/algorithms.md); one gradient each.
    `batch_weights`: prioritized replay's importance weight of each batch, in `batch_ids` order; empty means 1.0
    for all (fresh batches, the other patterns, and tasks written before the field existed)."""

    round: int
    batch_ids: tuple[str, ...]
    epoch: int
    minibatch: int
    num_minibatches: int
    batch_weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        w = self.batch_weights
        if w and (len(w) != len(self.batch_ids) or not all(math.isfinite(x) and x > 0.0 for x in w)):
            raise RecordError(f"learner task: {len(self.batch_ids)} batches need positive finite weights, got {w}")

    @property
    def weights(self) -> tuple[float, ...]:
        """One importance weight per batch id (1.0 where the task carries none)."""
        return self.batch_weights or (1.0,) * len(self.batch_ids)

    def fields(self) -> list[bytes | memoryview]:
        return encode_fields({}, {"kind": "task", **self.meta()})

    def meta(self) -> dict[str, Any]:
        # Weights travel only when there are any: a task without them keeps the wire format it always had.
        weighted = {"batch_weights": list(self.batch_weights)} if self.batch_weights else {}
        return {
            "round": self.round,
            "batch_ids": list(self.batch_ids),
            "epoch": self.epoch,
            "minibatch": self.minibatch,
            "num_minibatches": self.num_minibatches,
            **weighted,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> LearnerTask:
        what = "learner task"
        meta = _meta(fields, what, "task")
        ids = meta.get("batch_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RecordError(f"{what}: field 'batch_ids' must be a list of strings, got {ids!r}")
        weights = meta.get("batch_weights", [])
        if not isinstance(weights, list) or any(isinstance(w, bool) or not isinstance(w, int | float) for w in weights):
            raise RecordError(f"{what}: field 'batch_weights' must be a list of numbers, got {weights!r}")
        task = cls(
            round=_int(meta, "round", what),
            batch_ids=tuple(ids),
            epoch=_int(meta, "epoch", what),
            minibatch=_int(meta, "minibatch", what),
            num_minibatches=_int(meta, "num_minibatches", what),
            batch_weights=tuple(float(w) for w in weights),
        )
        if not 0 <= task.minibatch < task.num_minibatches:
            raise RecordError(f"{what}: minibatch {task.minibatch} outside 0..{task.num_minibatches - 1}")
        return task
