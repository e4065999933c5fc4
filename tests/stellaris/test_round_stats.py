"""A round's statistics from its calls (stellaris/round/stats.py), against hand-computed numbers: the split
of each call's latency into compute, waiting, cache I/O and invocation overhead, and the restarts its activation
record reports (idle instances the gateway found dead and replaced as the call looked for one)."""

from __future__ import annotations

import pytest

from contract import LearnerResult, ParameterResult
from gateway.models import Activation, Status
from stellaris.round.stats import Call, RoundStats


def _activation(duration_s: float, found_dead: int = 0) -> Activation:
    return Activation(id="a1", function="f", status=Status.SUCCESS, duration_s=duration_s, found_dead=found_dead)


def test_a_call_s_latency_splits_into_compute_wait_cache_and_invocation() -> None:
    stats = RoundStats()
    learner = LearnerResult(gradients=3, compute_s=0.04, wait_s=0.01, redis_round_trips=4).to_dict()
    stats.add(Call(learner, latency_s=0.125, activation=_activation(0.1)), "learner")
    # handler 0.1 s: 0.01 waiting, 0.04 computing, the rest (0.05) cache I/O; latency − handler = 0.025 invocation
    assert stats.learner_wait_s == pytest.approx(0.01) and stats.learner_compute_s == pytest.approx(0.04)
    assert stats.cache_s == pytest.approx(0.05) and stats.invocation_s == pytest.approx(0.025)
    assert stats.redis_round_trips == 4 and stats.learner_restarts == 0


def test_idle_instances_found_dead_count_as_restarts_of_their_role() -> None:
    stats = RoundStats()
    stats.add(Call(LearnerResult().to_dict(), latency_s=0.2, activation=_activation(0.1, found_dead=2)), "learner")
    stats.add(Call(ParameterResult().to_dict(), latency_s=0.2, activation=_activation(0.1, found_dead=1)), "parameter")
    stats.add(Call(LearnerResult().to_dict(), latency_s=0.2), "learner")  # in-process: no activation record
    assert (stats.learner_restarts, stats.parameter_restarts) == (2, 1)
