"""Declarative triggers (docs/workflows.md): when learners are invoked, as conditions over the batches
landed in the cache, and when the parameter function applies gradients (`contract.triggers`), both set in
config (`triggers:` in YAML, or `--triggers JSON`), never in the control plane's code.

A learner trigger fires when every condition it sets holds: `batches` landed, `steps` landed, the policy version
changed since the last firing, `period_s` elapsed since it, and `predicate` (an importable `module:function` called
with the `LandedFacts`) returns True. Setting neither `batches` nor `steps` means `steps` = the algorithm's train
batch size: the default trigger is the round Stellaris formed before triggers (a train batch of env steps). A
firing claims every batch landed since the last one. Pure evaluation here; the waiting and claiming is
`stellaris.round.protocol`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.triggers import ParameterTrigger

MAX_BATCHES = 4096  # far above any trajectory stream bound (actors x run-ahead), still a bound


@dataclass(frozen=True)
class LandedFacts:
    """The read-only view a learner trigger (and a predicate) decides on. `batches`, `steps`, `actors`: the batches
    landed and claimed since the last firing, their env steps and distinct actors. `version`: the policy version
    now; `fired_version`: at the last firing (None before the first). `since_fire_s`: seconds since the last firing
    (inf before the first). `round`: the round the firing would start."""

    round: int
    batches: int
    steps: int
    actors: int
    version: int
    fired_version: int | None
    since_fire_s: float


Predicate = Callable[[LandedFacts], bool]


def load_predicate(spec: str) -> Predicate:
    """`module:function` imported; raises ValueError saying what is wrong with it."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"{spec!r} is not module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import {module_name} ({exc})") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {module_name} has no function {attr}")
    return fn  # type: ignore[no-any-return]


class LearnerTrigger(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batches: int | None = Field(default=None, ge=1, le=MAX_BATCHES, description="batches landed (none: no count)")
    steps: int | None = Field(
        default=None, ge=1, le=1_000_000_000, description="env steps landed (none, with no batches: the train batch)"
    )
    version_changed: bool = Field(default=False, description="the policy version changed since the last firing")
    period_s: float | None = Field(default=None, gt=0, le=86_400, description="seconds since the last firing")
    predicate: str | None = Field(default=None, description="module:function(LandedFacts) -> bool")

    @field_validator("predicate")
    @classmethod
    def _importable(cls, predicate: str | None) -> str | None:
        if predicate is not None:
            load_predicate(predicate)
        return predicate

    @property
    def needs_version(self) -> bool:
        """Whether evaluating this trigger needs the policy version (a round trip to read)."""
        return self.version_changed or self.predicate is not None

    def step_target(self, train_batch_size: int) -> int | None:
        """The env steps a firing needs: `steps`, or the train batch when no count is set at all."""
        if self.steps is None and self.batches is None:
            return train_batch_size
        return self.steps

    def batches_short(self, landed: int) -> int:
        """How many more batches the `batches` condition needs (at least 1 to wait for when it holds already:
        the caller only asks while some other condition does not)."""
        return max(1, (self.batches or 0) - landed)

    def held(self, facts: LandedFacts, *, train_batch_size: int) -> dict[str, bool]:
        """Each condition this trigger sets, and whether it holds for `facts`. A firing needs a batch at least."""
        conditions = {"landed": facts.batches >= 1}
        if self.batches is not None:
            conditions["batches"] = facts.batches >= self.batches
        steps = self.step_target(train_batch_size)
        if steps is not None:
            conditions["steps"] = facts.steps >= steps
        if self.version_changed:
            conditions["version_changed"] = facts.fired_version is None or facts.version != facts.fired_version
        if self.period_s is not None:
            conditions["period_s"] = facts.since_fire_s >= self.period_s
        if self.predicate is not None:
            conditions["predicate"] = bool(load_predicate(self.predicate)(facts))
        return conditions

    def fires(self, facts: LandedFacts, *, train_batch_size: int) -> bool:
        return all(self.held(facts, train_batch_size=train_batch_size).values())


class Triggers(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    learner: LearnerTrigger = Field(default_factory=LearnerTrigger)
    parameter: ParameterTrigger = Field(default_factory=ParameterTrigger)

    def __str__(self) -> str:  # `--help` shows the default this way
        return self.model_dump_json(exclude_none=True)


class TriggerFields(BaseModel):
    """TrainConfig's `triggers` field (a mixin, so the config module stays small)."""

    triggers: Triggers = Field(
        default_factory=Triggers,
        description="when learners are invoked and the parameter function applies, as JSON (docs/workflows.md)",
    )

    @model_validator(mode="after")
    def _batches_fit_the_queue(self) -> Any:
        """A batch count beyond the trajectory queue's bound could never land: actors block on a full queue."""
        bound = int(getattr(self, "queue_bound", 1))
        wanted = self.triggers.learner.batches
        if wanted is not None and wanted > bound:
            raise ValueError(
                f"triggers.learner.batches: {wanted} exceeds the trajectory queue's bound {bound} "
                "(actors x actor_run_ahead; max_actors with elastic actors); raise actor_run_ahead or ask for fewer"
            )
        return self

    @field_validator("triggers", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        """`--triggers` gives JSON text; a YAML file gives the mapping itself."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from exc
