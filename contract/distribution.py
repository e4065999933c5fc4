"""Where a job's gradients are computed (MSRL's distribution policies), declared once for both sides: the control
plane's `TrainConfig` inherits `DistributionKnob`, and the job spec carries the same field to the functions.

- ``trajectories`` (the default): actors ship trajectory batches through the cache; learner functions compute the
  gradients and the parameter function applies them.
- ``gradients_at_actors`` (actor-learner fusion, A3C style): each actor computes the learner's gradients over its own
  batch, next to its envs, with the learner's algorithm code, and ships only gradients (plus a small batch header
  the control plane counts); no learner function is invoked.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

Distribution = Literal["trajectories", "gradients_at_actors"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)


def distribution_field() -> Distribution:
    return Field(  # type: ignore[no-any-return]
        default="trajectories",
        description="where gradients are computed: trajectories (actors ship trajectory batches to learner "
        "functions) or gradients_at_actors (each actor computes its batch's gradients and ships only those to the "
        "parameter function, A3C style; no learner is invoked)",
    )


class DistributionKnob(BaseModel):
    """The distribution profile, as a mixin of the control plane's config."""

    distribution: Distribution = distribution_field()
