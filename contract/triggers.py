"""The parameter function's trigger (docs/workflows.md): when it applies gradients, as a condition over
the gradient queue. It travels in the job spec, so both the control plane (which validates it) and the parameter
function (which gates on it) read the one declaration here.

The aggregation rule (Stellaris, sync, async, ...) decides as before; the trigger only says which of the queued
gradients the rule may see. The defaults (every gradient, no period) show the rule the whole queue at every look,
which is the parameter function's behaviour without triggers, exactly.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

MAX_GROUP = 65_536  # a group larger than any gradient stream bound could never fill


class ParameterTrigger(BaseModel):
    """Fire once `gradients` (K) gradients are queued and, when `period_s` is set, that long after the last firing;
    a firing hands the rule the oldest ⌊queued/K⌋·K gradients, so the rule aggregates whole groups of K. With no
    learner task left in flight nothing more can land, so what is queued is handed over whatever its size (the
    round's end must not wait for a group that cannot fill: liveness)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gradients: int = Field(default=1, ge=1, le=MAX_GROUP, description="gradients queued before a firing (K)")
    period_s: float | None = Field(
        default=None, gt=0, le=86_400, description="seconds between firings at least (none: no period)"
    )

    def visible(self, *, queued: int, in_flight: int, owed: int, since_fire_s: float) -> int:
        """How many of the oldest queued gradients the rule sees now. `owed`: gradients of an earlier firing that
        the rule has not applied yet (it deferred, or applies one at a time): they stay visible, so a firing's group
        is never split by the trigger. `since_fire_s`: seconds since the last firing (inf before the first)."""
        if queued < 0 or in_flight < 0 or owed < 0:
            raise ValueError(f"counts must be non-negative: queued={queued}, in_flight={in_flight}, owed={owed}")
        if in_flight == 0:
            return queued
        period_ok = self.period_s is None or since_fire_s >= self.period_s
        fired = queued // self.gradients * self.gradients if period_ok else 0
        return min(queued, max(owed, fired))

    def wait_s(self, since_fire_s: float) -> float:
        """Seconds until the period allows the next firing (0 when it does, or with no period)."""
        if self.period_s is None or math.isinf(since_fire_s):
            return 0.0
        return max(0.0, self.period_s - since_fire_s)
