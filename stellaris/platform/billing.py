"""A job's cost (docs/experiments.md): metered invocations under serverless billing; under serverful billing, and for
serverful actors always, the resources held for the wall-clock time they are held."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from gateway.models import ACTOR_PRICING, LEARNER_PRICING, Activation


class Billing:
    """`actor_function`: the gateway name whose activations are the actors' cost; every other is the learners'
    (learner and parameter functions); `spares`: warm spare instances of those, held like them. Costs carry over from
    a checkpoint's `state`."""

    def __init__(
        self,
        mode: Literal["serverless", "serverful"],
        *,
        actors: int,
        learners: int,
        actor_function: str,
        state: dict[str, Any],
        spares: int = 0,
    ) -> None:
        self.mode, self.actors, self.learners, self.actor_function = mode, actors, learners, actor_function
        self.spares = spares
        self.cost_learner = float(state.get("cost_learner", state.get("cost", 0.0)))
        self.cost_actor = float(state.get("cost_actor", 0.0))
        self.actors_charged_until = self.serverful_charged_until = time.monotonic()

    def actors_started(self) -> None:
        """Serverful actors are charged from now."""
        self.actors_charged_until = time.monotonic()

    def charge(self, acts: Sequence[Activation]) -> None:
        """Under serverless billing charge each activation its metered cost."""
        if self.mode == "serverful":
            return  # held resources are charged by the wall clock instead, in charge_held
        self.cost_actor += sum(a.cost_usd for a in acts if a.function == self.actor_function)
        self.cost_learner += sum(a.cost_usd for a in acts if a.function != self.actor_function)

    def charge_held(self, *, serverful_actors: bool) -> None:
        """Serverful resources are charged for the whole wall-clock time they are held: serverful actors always
        (one core each); under serverful billing also every actor and the learner capacity plus the parameter
        server and their warm spares, at the same per-resource-second prices the meter uses."""
        now = time.monotonic()
        if serverful_actors or self.mode == "serverful":
            self.cost_actor += (now - self.actors_charged_until) * self.actors * ACTOR_PRICING.usd_per_second
        self.actors_charged_until = now
        if self.mode == "serverful":
            slots = self.learners + 1 + self.spares
            self.cost_learner += (now - self.serverful_charged_until) * slots * LEARNER_PRICING.usd_per_second
        self.serverful_charged_until = now

    @property
    def cost(self) -> float:
        return self.cost_learner + self.cost_actor

    def state(self) -> dict[str, float]:
        """What a checkpoint keeps."""
        return {"cost": self.cost, "cost_learner": self.cost_learner, "cost_actor": self.cost_actor}
