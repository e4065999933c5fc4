"""What an instance's answer means to the gateway (the runtime's HTTP contract, seen from the pool); no server."""

from __future__ import annotations

from typing import Any

import pytest

from contract.runtime_http import ErrorType, RuntimeStatus, gateway_status
from gateway.invocation import Answer, Outcome
from gateway.models import Status

OUTCOME = Outcome(None, "fn-1", cold=False, init_s=None, wait_s=0.0, duration_s=0.1)


def test_a_json_object_with_200_is_a_result() -> None:
    assert Answer(200, {"x": 1}, 0.1).ok


@pytest.mark.parametrize(
    ("status", "body", "code", "outcome", "kind"),
    [
        (200, [1, 2], 502, Status.ERROR, "BadResponse"),  # 200 without a JSON object: the instance's fault
        (400, {"error": {"type": ErrorType.INVALID_EVENT, "message": "m"}}, 502, Status.ERROR, "InvalidEvent"),
        (429, {"error": {"type": ErrorType.QUEUE_FULL, "message": "m"}}, 502, Status.ERROR, "QueueFull"),
        (500, {"error": {"type": "ValueError", "message": "boom"}}, 502, Status.ERROR, "ValueError"),
        (503, {"error": {"type": ErrorType.DRAINING, "message": "m"}}, 502, Status.ERROR, "Draining"),
        (504, {"error": {"type": ErrorType.TIMEOUT, "message": "m", "recycle": True}}, 504, Status.TIMEOUT, "Timeout"),
        (502, "<html>proxy</html>", 502, Status.ERROR, "BadResponse"),
    ],
)
def test_a_failed_answer_maps_to_the_gateway_status(
    status: int, body: Any, code: int, outcome: Status, kind: str
) -> None:
    answer = Answer(status, body, None)
    assert not answer.ok
    failed = answer.failure(OUTCOME)
    assert (failed.status_code, failed.status, failed.error["type"]) == (code, outcome, kind)
    assert failed.outcome is OUTCOME


def test_only_a_timed_out_call_asks_for_a_recycle() -> None:
    timed_out = {"error": {"type": ErrorType.TIMEOUT, "message": "m", "recycle": True}}
    queue_timeout = {"error": {"type": ErrorType.QUEUE_TIMEOUT, "message": "m", "recycle": False}}
    assert Answer(504, timed_out, None).recycle
    assert not Answer(504, queue_timeout, None).recycle
    assert not Answer(500, {"error": {"type": "E", "message": "m", "recycle": True}}, None).recycle


def test_the_status_mapping_covers_every_runtime_status() -> None:
    assert {s: gateway_status(s) for s in RuntimeStatus} == {
        RuntimeStatus.OK: 200,
        RuntimeStatus.BAD_REQUEST: 502,
        RuntimeStatus.UNAUTHORIZED: 502,  # the gateway sent a wrong secret: the instance is not one of ours
        RuntimeStatus.QUEUE_FULL: 502,
        RuntimeStatus.HANDLER_ERROR: 502,
        RuntimeStatus.DRAINING: 502,
        RuntimeStatus.TIMEOUT: 504,
    }
