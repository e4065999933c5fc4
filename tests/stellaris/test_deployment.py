"""How the control plane reads a failed call (stellaris/platform/deployment.py `GatewayFunctions.gone`): whether the
instance that held the call is known to be gone, so that its task and update leases are freed at once rather than
when they run out."""

from __future__ import annotations

import pytest

from gateway.client import GatewayClient, GatewayError
from stellaris.platform.deployment import GatewayFunctions


@pytest.mark.parametrize(
    ("kind", "die_with_gateway", "gone"),
    [
        ("InstanceCrashed", False, True),
        ("InstanceHung", False, True),
        ("Timeout", False, True),
        ("GatewayRestarted", True, True),  # the local gateway's process instances died with it
        ("GatewayRestarted", False, False),  # containers and Ray actors outlive their gateway
        ("GatewayUnreachable", True, False),  # a dropped connection: the gateway and its instances may be working
        ("Overloaded", True, False),
    ],
)
def test_a_failed_calls_instance_is_taken_for_gone_only_when_the_error_says_so(
    kind: str, die_with_gateway: bool, gone: bool
) -> None:
    with GatewayClient("http://127.0.0.1:9") as client:
        functions = GatewayFunctions(client, {}, die_with_gateway=die_with_gateway)
        assert functions.gone(GatewayError(502, {"type": kind, "message": "m"})) is gone
        assert not functions.gone(RuntimeError(kind))
