"""One call to one instance over the runtime's HTTP contract (contract/runtime_http.py), and what its answer
means to the gateway: a result, or a failure with the status the gateway answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from contract.runtime_http import (
    CALL_ID_HEADER,
    DURATION_MS_HEADER,
    INVOKE_PATH,
    RECYCLE_FIELD,
    SECRET_HEADER,
    RuntimeStatus,
    gateway_status,
)
from gateway.models import Status

BODY_EXCERPT_CHARS = 500


@dataclass
class Outcome:
    result: dict[str, Any] | None
    instance: str
    cold: bool
    init_s: float | None
    wait_s: float
    duration_s: float
    container_id: str | None = None  # the instance's container (docker backend)
    node: str | None = None  # the node it runs on (ray backend)
    found_dead: int = 0  # idle instances found dead (and replaced) while the call looked for one


@dataclass
class InvocationFailed(Exception):
    """The call did not produce a result; `status_code` is what the gateway answers."""

    status_code: int
    status: Status
    error: dict[str, Any]
    outcome: Outcome | None = None


class InstanceUnreachable(Exception):
    """The connection to the instance failed or broke mid-answer: it died."""


@dataclass
class Answer:
    """What an instance's runtime answered to POST /invoke."""

    status: int
    body: Any
    duration_s: float | None  # the handler's own time (X-Duration-Ms), when the runtime reported it

    @property
    def ok(self) -> bool:
        return self.status == RuntimeStatus.OK and isinstance(self.body, dict)

    @property
    def error(self) -> dict[str, Any]:
        body = self.body
        if isinstance(body, dict):
            error = body.get("error", body)
            return error if isinstance(error, dict) else {"type": "BadResponse", "message": str(error)}
        return {"type": "BadResponse", "message": str(body)}

    @property
    def recycle(self) -> bool:
        """The runtime timed out a call whose thread still runs: the instance must be replaced."""
        return self.status == RuntimeStatus.TIMEOUT and bool(self.error.get(RECYCLE_FIELD))

    def failure(self, outcome: Outcome) -> InvocationFailed:
        # A 200 without a JSON object is the instance's fault like any other bad answer (502).
        code = 502 if self.status == RuntimeStatus.OK else gateway_status(self.status)
        return InvocationFailed(code, Status.TIMEOUT if code == 504 else Status.ERROR, self.error, outcome)


async def post_event(
    http: aiohttp.ClientSession,
    url: str,
    event: dict[str, Any],
    *,
    call_id: str,
    timeout_s: float,
    secret: str | None = None,
) -> Answer:
    """POST the event to the instance at `url` (with its `secret`, if it has one); raises InstanceUnreachable, or
    TimeoutError past `timeout_s`."""
    headers = {CALL_ID_HEADER: call_id} if secret is None else {CALL_ID_HEADER: call_id, SECRET_HEADER: secret}
    try:
        async with http.post(
            f"{url}{INVOKE_PATH}",
            json=event,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:  # not JSON (e.g. a proxy's or server's plain-text error page)
                text = (await resp.text(errors="replace"))[:BODY_EXCERPT_CHARS]
                body = {"error": {"type": "BadResponse", "message": f"instance answered {resp.status}: {text}"}}
            duration_ms = resp.headers.get(DURATION_MS_HEADER)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise InstanceUnreachable(str(exc)) from exc
    return Answer(resp.status, body, float(duration_ms) / 1000 if duration_ms else None)
