"""What one round's invocations leave behind: the round's statistics (`RoundStats`) of its finished calls (`Call`,
stellaris/platform/calls.py), read from the handlers' results through the records of `contract`."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract import ActorResult, LearnerResult, ParameterResult
from gateway.models import Activation
from stellaris.platform.calls import Call, Role

__all__ = ["Call", "Role", "RoundStats"]


@dataclass
class RoundStats:
    learner_results: list[LearnerResult] = field(default_factory=list)
    parameter_results: list[ParameterResult] = field(default_factory=list)
    actor_results: list[ActorResult] = field(default_factory=list)
    activations: list[Activation] = field(default_factory=list)
    max_in_flight: int = 0
    learner_wait_s: float = 0.0
    learner_restarts: int = 0
    parameter_restarts: int = 0
    actor_restarts: int = 0
    redis_round_trips: int = 0  # every function's and the control plane's, end to end
    # Latency breakdown (paper Fig. 14), seconds summed over the round's calls: algorithm time inside learner and
    # parameter handlers, the rest of their handler time (cache I/O, (de)serialisation), and invocation overhead
    # (client-observed latency minus handler time: HTTP, gateway queueing, instance dispatch).
    learner_compute_s: float = 0.0
    parameter_compute_s: float = 0.0
    cache_s: float = 0.0
    invocation_s: float = 0.0

    def add(self, call: Call, role: Role) -> None:
        metered = call.metered
        if metered is not None:
            self.activations.append(metered)
        handler = call.handler_s
        self.invocation_s += max(0.0, call.latency_s - handler)
        if role == "actor":
            self.actor_results.append(ActorResult.from_dict(call.result))
            return  # an actor's round trips are counted from its batch's header
        timed: LearnerResult | ParameterResult
        if role == "learner":
            timed = LearnerResult.from_dict(call.result)
            self.learner_results.append(timed)
        else:
            timed = ParameterResult.from_dict(call.result)
            self.parameter_results.append(timed)
        self.redis_round_trips += timed.redis_round_trips
        # Time blocked waiting for work (a learner for tasks others hold, the parameter function for gradients)
        # is neither computation nor platform overhead.
        waited = min(timed.wait_s, handler)
        compute = min(timed.compute_s, handler - waited)
        self.cache_s += handler - waited - compute
        # Idle instances of its function the gateway found dead (and replaced) as this call looked for one: a
        # restart too, though no call failed.
        found_dead = call.activation.found_dead if call.activation is not None else 0
        if role == "learner":
            self.learner_compute_s += compute
            self.learner_wait_s += waited
            self.learner_restarts += found_dead
        else:
            self.parameter_compute_s += compute
            self.parameter_restarts += found_dead
