"""A modelled round's cost, by the project's cost model (docs/experiments.md#cost-model): an invocation is charged its
duration at its function's price per resource-second (`gateway.metering.charge`, `gateway.models.Pricing`), cold-start
time not included, as the gateway meters it; serverful resources are charged for the wall-clock time they are held,
as `stellaris/platform/billing.py` charges them. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.metering import charge
from gateway.models import ACTOR_PRICING, LEARNER_PRICING


@dataclass(frozen=True)
class RoundCost:
    learner: float  # learner and parameter functions
    actor: float

    @property
    def total(self) -> float:
        return self.learner + self.actor


def round_cost(
    *,
    billing: Literal["serverless", "serverful"],
    actor_kind: Literal["serverful", "serverless"],
    actors: int,
    round_s: float,
    actor_s: Sequence[float],
    learner_s: Sequence[float],
    parameter_s: float,
) -> RoundCost:
    """One round's cost. `round_s`: the round's wall-clock seconds; `actor_s`: each actor invocation's seconds (its
    collection); `learner_s`: each learner invocation's billed seconds; `parameter_s`: the parameter invocation's.

    Serverless billing: each learner and parameter invocation at the learners' price; serverless actors their
    collections at the actors' price, serverful actors (held processes) all `actors` for the whole round. Serverful
    billing: the learner capacity and the parameter server (len(learner_s) + 1 slots) and every actor, for the whole
    round."""
    if billing == "serverful":
        slots = len(learner_s) + 1
        return RoundCost(
            learner=slots * charge(round_s, LEARNER_PRICING)[1], actor=actors * charge(round_s, ACTOR_PRICING)[1]
        )
    learner = sum(charge(s, LEARNER_PRICING)[1] for s in (*learner_s, parameter_s))
    if actor_kind == "serverful":
        return RoundCost(learner=learner, actor=actors * charge(round_s, ACTOR_PRICING)[1])
    return RoundCost(learner=learner, actor=sum(charge(s, ACTOR_PRICING)[1] for s in actor_s))
