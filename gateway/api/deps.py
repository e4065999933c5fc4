"""Dependencies of the routes: the running gateway, the two bearer tokens, and an invocation's event body."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from gateway.instances import affinity_key
from gateway.limits import parse_json
from gateway.models import AFFINITY_HEADER
from gateway.service import Gateway


def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _bearer_matches(request: Request, *tokens: str | None) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and any(
        t is not None and secrets.compare_digest(given.encode(), t.encode()) for t in tokens
    )


def authorised(request: Request) -> None:
    """The admin token (`token`): every route but health. No token configured: an open loopback gateway."""
    token = get_gateway(request).settings.token
    if token is not None and not _bearer_matches(request, token):
        raise HTTPException(401, "missing or bad bearer token (admin)", headers={"WWW-Authenticate": "Bearer"})


def may_invoke(request: Request) -> None:
    """Invoking and reading activations: the admin token or the invoke token (`invoke_token`)."""
    settings = get_gateway(request).settings
    if settings.token is not None and not _bearer_matches(request, settings.token, settings.invoke_token):
        raise HTTPException(401, "missing or bad bearer token", headers={"WWW-Authenticate": "Bearer"})


def is_admin(request: Request) -> bool:
    """Whether the caller holds the admin token, or the gateway has none (an open loopback gateway: all are admin)."""
    token = get_gateway(request).settings.token
    return token is None or _bearer_matches(request, token)


def shown_error(request: Request, error: dict[str, Any] | None) -> dict[str, Any] | None:
    """A failed call's error as this caller may see it: all of it (the handler's traceback too) for the admin; its
    type and message only for an invoke-token caller, whom file paths and code of the handler do not concern."""
    if error is None or is_admin(request):
        return error
    return {"type": error.get("type"), "message": error.get("message")}


class AuthFirst(APIRoute):
    """A route whose token is checked before its body is read: FastAPI parses a body (a 422 when it is not JSON)
    before it solves any dependency, which would tell a caller without a token how its body fares."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        checks = [c for c in (authorised, may_invoke) if any(d.call is c for d in self.dependant.dependencies)]

        async def checked(request: Request) -> Response:
            for check in checks:
                check(request)  # raises the 401, answered by the app's handler like any other
            return await handler(request)

        return checked


async def read_event(request: Request) -> dict[str, Any]:
    """The body as an event: a JSON object within the nesting cap; an empty body is `{}` (422 otherwise)."""
    raw = await request.body()
    try:
        event = parse_json(raw, get_gateway(request).settings.max_json_depth) if raw else {}
    except ValueError as exc:
        raise HTTPException(422, f"body: not valid JSON ({exc})") from exc
    if not isinstance(event, dict):
        raise HTTPException(422, f"body: the event must be a JSON object, got {type(event).__name__}")
    return event


def read_affinity(request: Request) -> str | None:
    """The call's `X-Affinity-Key` (gateway/instances.py), or None; an over-long key is a 400 that names it."""
    try:
        return affinity_key(request.headers.get(AFFINITY_HEADER))
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
Auth = Annotated[None, Depends(authorised)]
InvokeAuth = Annotated[None, Depends(may_invoke)]
