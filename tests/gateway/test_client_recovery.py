"""The gateway client's recovery hook: a request that cannot reach the gateway asks `on_unreachable` where the gateway
is now. A registry request is sent again there; an invocation fails with a 502 that says whether the gateway that
held it was replaced since it was sent (`GatewayRestarted`: the control plane may take its process instances for
dead) or not (`GatewayUnreachable`)."""

from __future__ import annotations

import socket

import pytest

from cache.server import free_port
from gateway.client import GatewayClient, GatewayError, Recovered


def _nobody() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    port = free_port()
    with socket.socket() as s:  # still free: the refusal below is the kernel's, not a race
        s.bind(("127.0.0.1", port))
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(("replaced", "kind"), [(1, "GatewayRestarted"), (0, "GatewayUnreachable")])
def test_an_invocation_cut_off_says_whether_its_gateway_was_replaced(replaced: int, kind: str) -> None:
    dead, back = _nobody(), _nobody()
    asked: list[int] = []

    def recover() -> Recovered:
        asked.append(1)
        return Recovered(back, replaced)

    with GatewayClient(dead, on_unreachable=recover) as client:
        with pytest.raises(GatewayError) as failed:
            client.invoke("f", {})
        assert failed.value.status_code == 502 and failed.value.error["type"] == kind, failed.value.error
        assert "ConnectError" in failed.value.error["message"]
        assert asked == [1] and str(client.http.base_url).rstrip("/") == back and client.replaced == replaced

        # A later call went to the gateway now there: not replaced since, whatever happened before.
        with pytest.raises(GatewayError) as again:
            client.invoke("f", {})
        assert again.value.error["type"] == "GatewayUnreachable" and asked == [1, 1]


def test_without_a_hook_the_transport_error_is_raised_as_it_is() -> None:
    import httpx

    with GatewayClient(_nobody()) as client, pytest.raises(httpx.ConnectError):
        client.invoke("f", {})
