"""Serverful billing charges every held slot for the wall-clock time it is held: learners, the parameter server
and their warm spares."""

from __future__ import annotations

import time

import pytest

from gateway.models import LEARNER_PRICING
from stellaris.platform.billing import Billing


@pytest.mark.parametrize(("learners", "spares", "slots"), [(1, 0, 2), (2, 0, 3), (1, 2, 4)])
def test_serverful_billing_charges_learners_the_parameter_server_and_spares(
    learners: int, spares: int, slots: int
) -> None:
    billing = Billing("serverful", actors=1, learners=learners, actor_function="j-actor", state={}, spares=spares)
    billing.serverful_charged_until = time.monotonic() - 100.0  # held for 100 s (and the few µs until the charge)
    billing.charge_held(serverful_actors=False)
    held_s = billing.cost_learner / (slots * LEARNER_PRICING.usd_per_second)
    assert 100.0 <= held_s < 101.0


def test_serverless_billing_charges_no_held_slot() -> None:
    billing = Billing("serverless", actors=1, learners=1, actor_function="j-actor", state={}, spares=2)
    billing.serverful_charged_until = time.monotonic() - 100.0
    billing.charge_held(serverful_actors=False)
    assert billing.cost_learner == 0.0
