"""The Stellaris mechanisms' knobs (docs/algorithms.md), each declared once with its default, bounds and help text.

Both sides derive from here: the control plane's `TrainConfig` (YAML fields and the `stellaris train` flags) and
the functions' `StellarisConfig` (the job spec's `stellaris` section) inherit `StellarisKnobs` and take the rule
from `rule_field()`. The rule is `mode` to a user (flag, YAML, run names) and `stellaris.rule` in the job spec;
`TRAIN_NAMES` maps the spec's name to the user's where they differ.
"""

from __future__ import annotations

from copy import copy
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

RuleName = Literal["stellaris", "sync", "async", "softsync", "ssp"]
RULE_NAMES: tuple[str, ...] = get_args(RuleName)

_RULE = Field(
    default="stellaris",
    validate_default=True,  # so that a model narrowing the type (an enum of these names) gets its member
    description="aggregation rule: stellaris (staleness-aware: threshold β_k, scale 1/δ^(1/v)), or the baselines "
    "sync, async, softsync (K gradients an update), ssp (staleness bound s)",
)


def rule_field() -> Any:
    """The rule's declaration, for the field that holds it (`TrainConfig.mode`, `StellarisConfig.rule`)."""
    return copy(_RULE)


class StellarisKnobs(BaseModel):
    """The knobs both sides share, besides the rule."""

    d: float = Field(
        default=0.96, ge=0.0, le=1.0,
        description="decay of the staleness threshold β_k = δ_max·d^k of round k (0: synchronous, 1: asynchronous)",
    )  # fmt: skip
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
