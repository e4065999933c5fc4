"""What each handler returns, as records: the handler builds one and sends `to_dict()` over HTTP; the control plane
reads it back with `from_dict`, which names the field that is missing or of the wrong type. No handler result is
read by string key anywhere else. (`EvalRequest` goes the other way: the control plane's half of an evaluation.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Literal, Self

import msgpack
from pydantic import Field, TypeAdapter, ValidationError

from contract.errors import RecordError


class ResultError(RecordError):
    """A handler result lacks a field or carries one of the wrong type."""


class _Result:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        try:
            return _adapter(cls).validate_python(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'result'}: {e['msg']}" for e in exc.errors())
            raise ResultError(f"{cls.__name__}: {problems}") from exc


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


@dataclass(frozen=True)
class _Timed(_Result):
    """Seconds of algorithm time and of waiting for work inside the handler, and its Redis round trips: the
    control plane splits a call's latency into compute, cache and invocation overhead (paper Fig. 14)."""

    compute_s: float = 0.0
    wait_s: float = 0.0
    redis_round_trips: int = 0


def device_of(result: Mapping[str, Any] | None) -> str:
    """The device a handler's result says it computed on (`device` of LearnerResult, ParameterResult and
    InitResult, as torch names it: ``cpu``, ``cuda:0``); ``cpu`` for a result without one (actors compute on the
    CPU), '' for a call that returned no result."""
    if result is None:
        return ""
    device = result.get("device", "cpu")
    return device if isinstance(device, str) else ""


@dataclass(frozen=True)
class LearnerResult(_Timed):
    """One learner invocation: the gradients it stored, the tasks it lost to a takeover or dead-lettered, and the
    sums the control plane averages per round (loss; truncated and clipped fractions over the gradients that report
    one), and the device it computed on."""

    status: Literal["done", "timeout"] = "done"
    gradients: int = 0
    lost: int = 0
    dead_lettered: int = 0
    loss_sum: float = 0.0
    truncated_sum: float = 0.0
    truncated_n: int = 0
    clipped_sum: float = 0.0
    clipped_n: int = 0
    device: str = "cpu"

    def with_gradient(self, stats: Mapping[str, Any]) -> LearnerResult:
        """Counted: one stored gradient with its statistics (`loss`; `truncated_fraction` and `clip_fraction` where
        it has them)."""
        return replace(
            self,
            gradients=self.gradients + 1,
            loss_sum=self.loss_sum + float(stats.get("loss", 0.0)),
            truncated_sum=self.truncated_sum + float(stats.get("truncated_fraction", 0.0)),
            truncated_n=self.truncated_n + ("truncated_fraction" in stats),
            clipped_sum=self.clipped_sum + float(stats.get("clip_fraction", 0.0)),
            clipped_n=self.clipped_n + ("clip_fraction" in stats),
        )


@dataclass(frozen=True)
class DecisionRow:
    """One applied aggregation of a parameter invocation: the rule's decision, how many gradients, the version."""

    decision: str
    count: int
    version: int


@dataclass(frozen=True)
class ParameterResult(_Timed):
    """One serving parameter invocation: how it ended, the newest version, and its newest applied decisions.
    `busy`: another invocation holds the update lease; `fenced`: its lease was lost to a replacement. `device`:
    where it held the policy and optimizer."""

    status: Literal["ok", "busy", "fenced", "expired"] = "ok"
    version: int | None = None
    decisions: list[DecisionRow] = field(default_factory=list)
    device: str = "cpu"


@dataclass(frozen=True)
class InitResult(_Result):
    """The parameter function's `init` call: version 0 published, the job's resolved spec (JSON), and the device
    its warm policy and optimizer are on."""

    version: int
    spec: dict[str, Any]
    status: Literal["ok"] = "ok"
    device: str = "cpu"


@dataclass(frozen=True)
class ActorResult(_Result):
    """One serverless actor invocation: the batch it pushed, its behaviour version, steps and finished episodes."""

    batch_id: str
    version: int
    env_steps: int
    episode_returns: list[float] = field(default_factory=list)


# An evaluation episode's steps are bounded, so that an env without a TimeLimit of its own, or a deterministic policy
# stuck in a loop (Breakout without FIRE), cannot hold an evaluation forever; an env's own TimeLimit ends episodes
# first (CartPole-v1: 500 steps).
EVAL_MAX_EPISODE_STEPS = 10_000
EVAL_MAX_EPISODE_STEPS_LIMIT = 10_000_000
EVAL_EPISODES_LIMIT = 10_000


@dataclass(frozen=True)
class EvalRequest(_Result):
    """An actor invocation's `evaluate` event: `episodes` whole episodes with deterministic actions on an env of its
    own reset with `seed`, of the policy `version` (None: the newest), each at most `max_episode_steps` steps."""

    episodes: Annotated[int, Field(ge=1, le=EVAL_EPISODES_LIMIT)]
    seed: int
    version: Annotated[int, Field(ge=0)] | None = None
    max_episode_steps: Annotated[int, Field(ge=1, le=EVAL_MAX_EPISODE_STEPS_LIMIT)] = EVAL_MAX_EPISODE_STEPS


@dataclass(frozen=True)
class EvalResult(_Result):
    """One evaluation: the policy version it ran, each episode's undiscounted return and length in order, and how
    many episodes were ended at `max_episode_steps` rather than by the env."""

    version: int
    episode_returns: list[float]
    episode_lengths: list[int]
    cut: int = 0


@dataclass(frozen=True)
class AppliedGradient:
    """One gradient of an applied aggregation: its stream id, task id, round, base version and staleness."""

    gradient_id: str
    task_id: str
    round: int
    base_version: int
    staleness: int

    def to_list(self) -> list[Any]:
        return [self.gradient_id, self.task_id, self.round, self.base_version, self.staleness]

    @classmethod
    def from_list(cls, item: list[Any]) -> Self:
        gradient_id, task_id, round_k, base_version, staleness = item
        return cls(str(gradient_id), str(task_id), int(round_k), int(base_version), int(staleness))


@dataclass(frozen=True)
class AppliedRow:
    """One entry of the job's applied log (written atomically with the version it produced)."""

    version: int
    decision: str
    round: int
    threshold: float | None
    gradients: list[AppliedGradient]

    def to_fields(self) -> dict[str, Any]:
        """The applied log entry's fields but `version`, which the publish script adds with the version it made."""
        return {
            "decision": self.decision,
            "round": self.round,
            "threshold": "" if self.threshold is None else self.threshold,
            "gradients": msgpack.packb([g.to_list() for g in self.gradients]),
        }

    @classmethod
    def from_fields(cls, raw: Mapping[bytes, bytes]) -> Self:
        """From the applied log's stream entry as Redis returns it (bytes fields; `threshold` empty for None,
        `gradients` a msgpack list of `AppliedGradient.to_list()`)."""
        try:
            threshold = raw.get(b"threshold", b"").decode()
            return cls(
                version=int(raw[b"version"]),
                decision=raw[b"decision"].decode(),
                round=int(raw[b"round"]),
                threshold=float(threshold) if threshold else None,
                gradients=[AppliedGradient.from_list(g) for g in msgpack.unpackb(raw[b"gradients"])],
            )
        except (KeyError, ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ResultError(f"AppliedRow: bad applied-log entry ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class RoundShape(_Result):
    """The part of a job's resolved spec (`InitResult.spec`, its `algo` section) that shapes the job's rounds: the
    env steps of a train batch and the (epoch, minibatch) tasks over it. The control plane plans rounds from it."""

    train_batch_size: int
    num_epochs: int
    num_minibatches: int

    @classmethod
    def of_spec(cls, spec: Mapping[str, Any]) -> Self:
        return cls.from_dict(spec.get("algo"))
