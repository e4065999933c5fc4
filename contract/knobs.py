"""The Stellaris mechanisms' knobs (docs/algorithms.md), each declared once with its default, bounds and help text,
and the aggregation rules' names (`Rule`), declared once.

Both sides derive from here: the control plane's `TrainConfig` (YAML fields and the `stellaris train` flags) and
the functions' `StellarisConfig` (the job spec's `stellaris` section) inherit `StellarisKnobs` and take the rule
from `rule_field()`. The rule is `mode` to a user (flag, YAML, run names) and `stellaris.rule` in the job spec;
`TRAIN_NAMES` maps the spec's name to the user's where they differ. A knob's bounds are checked where a value enters
(the models); a pure equation that may be given a raw value checks it against the same declaration (`check_knob`).
"""

from __future__ import annotations

import functools
from copy import copy
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo


class Rule(StrEnum):
    """Aggregation rules of the parameter function (docs/algorithms.md); YAML and JSON spell them as their values."""

    STELLARIS = "stellaris"
    SYNC = "sync"
    ASYNC = "async"
    SOFTSYNC = "softsync"
    SSP = "ssp"


_RULE = FieldInfo(
    default=Rule.STELLARIS,
    description="aggregation rule: stellaris (staleness-aware: threshold β_k, scale 1/δ^(1/v)), or the baselines "
    "sync, async, softsync (K gradients an update), ssp (staleness bound s)",
)


def rule_field() -> Any:
    """The rule's declaration, for the field that holds it (`TrainConfig.mode`, `StellarisConfig.rule`)."""
    return copy(_RULE)


class StellarisKnobs(BaseModel):
    """The knobs both sides share, besides the rule."""

    d: float = Field(
        default=0.96,
        ge=0.0,
        le=1.0,
        description="decay of the staleness threshold β_k = δ_max·d^k of round k (0: synchronous, 1: asynchronous)",
    )
    v: float = Field(default=3.0, gt=0.0, description="a gradient of staleness δ > 0 is scaled by 1/δ^(1/v)")
    rho: float = Field(
        default=1.0,
        gt=0.0,
        description="truncation bound ρ: importance weights across learner policies are capped at ρ",
    )
    truncation: bool = Field(default=True, description="importance-sampling truncation across learner policies")
    softsync_k: int = Field(default=4, ge=1, description="softsync rule: gradients per update (K)")
    ssp_bound: int = Field(default=2, ge=0, description="ssp rule: the staleness bound (s)")


# The user's (TrainConfig's, the CLI's) name of a knob where it differs from the job spec's.
TRAIN_NAMES: dict[str, str] = {"rule": "mode"}
KNOB_NAMES: tuple[str, ...] = ("rule", *StellarisKnobs.model_fields)


def knob_info(name: str) -> FieldInfo:
    """The declaration of a knob by its job-spec name: default, bounds (metadata) and description."""
    return _RULE if name == "rule" else StellarisKnobs.model_fields[name]


def train_name(name: str) -> str:
    return TRAIN_NAMES.get(name, name)


@functools.cache
def _knob_adapter(name: str) -> TypeAdapter[Any]:
    info = knob_info(name)
    return TypeAdapter(Annotated[info.annotation, *info.metadata])  # type: ignore[arg-type]


def check_knob(name: str, value: Any) -> None:
    """`value` against knob `name`'s declared type and bounds, for a pure equation a caller may give a raw value; a
    ValueError naming the knob (e.g. `d: Input should be less than or equal to 1, got 1.5`)."""
    try:
        _knob_adapter(name).validate_python(value)
    except ValidationError as exc:
        raise ValueError(f"{name}: {exc.errors()[0]['msg']}, got {value!r}") from None
