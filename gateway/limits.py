"""The gateway's limits at its edge: a body cap (413) and deadline (408), a JSON nesting cap (400), and what a
registration may ask for (422), all configurable.

The body cap is an ASGI middleware: a declared Content-Length over the cap is refused before anything is read,
and a body without one (chunked) is counted as it arrives and refused once it passes the cap, so no request can
make the gateway buffer more than the cap. Routes turn the exceptions raised here into JSON errors.
"""

from __future__ import annotations

import asyncio
import fnmatch
import importlib.util
import json
import sys
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.models import FunctionSpec
from gateway.settings import ENV_DENY, GatewaySettings


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the gateway's limit of {limit} bytes (max_body_bytes)")


class BodyTooSlow(HTTPException):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"request body stalled for {timeout_s:g} s (body_timeout_s)")


class TooDeep(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(400, f"body: JSON nested deeper than the gateway's limit of {limit} (max_json_depth)")


# The `type` of the JSON error answered for each client-fault status, here and in the app's exception handler.
ERROR_KINDS = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    408: "RequestTimeout",
    409: "Conflict",
    413: "PayloadTooLarge",
    422: "ValidationError",
}


def _error_response(exc: HTTPException) -> dict[str, Any]:
    return {"error": {"type": ERROR_KINDS.get(exc.status_code, "HTTPError"), "message": str(exc.detail)}}


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body per request, each chunk within `timeout_s` of the last."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _send_json(send, BodyTooLarge(self.max_bytes))
            return
        seen, done = 0, False

        async def counted() -> Message:
            nonlocal seen, done
            if done:  # the body is in: later receives wait for a disconnect, for as long as the call runs
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError as exc:
                raise BodyTooSlow(self.timeout_s) from exc
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
                done = not message.get("more_body", False)
            return message

        await self.app(scope, counted, send)


async def _send_json(send: Send, exc: HTTPException) -> None:
    body = json.dumps(_error_response(exc)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0, `[]` and `{}` are 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def parse_json(raw: bytes, max_depth: int) -> Any:
    """`raw` decoded, refused (TooDeep) past `max_depth` levels; ValueError when it is not JSON."""
    try:
        value = json.loads(raw)
    except RecursionError as exc:  # deeper than the decoder itself can go
        raise TooDeep(max_depth) from exc
    if json_depth(value) > max_depth:
        raise TooDeep(max_depth)
    return value


def module_exists(name: str) -> bool:
    """Whether `name` (a dotted module path) can be found, without running any of its code: unlike
    importlib.util.find_spec, which imports the parent packages, each part is looked up in the one above it (the
    gateway imports no handler code, docs/architecture.md)."""
    if name in sys.modules:
        return True
    found: ModuleSpec | None = None
    for part in name.split("."):
        where = None if found is None else found.submodule_search_locations
        if found is not None and where is None:  # a plain module has no submodules
            return False
        # The top level through every finder (an editable install maps its packages with a meta-path finder of its
        # own, not a sys.path entry: found from any directory); a top-level lookup runs no code. Below it, only
        # the parent's own directories.
        found = importlib.util.find_spec(part) if found is None else PathFinder.find_spec(f"{found.name}.{part}", where)
        if found is None:
            return False
    return True


def check_registration(spec: FunctionSpec, settings: GatewaySettings) -> None:
    """Refuse (422, naming the field) a function that asks for more than this gateway allows: more instances or
    memory than its caps (so no registration or pre-warm can exhaust the host), a handler outside the allowed
    module prefixes, or an environment variable off the allow-list or on the deny list (variables that change how
    an interpreter or loader starts would let a registrant run any code as the gateway's user)."""
    problems = []  # min_warm is at most max_instances already (FunctionSpec)
    if spec.target is not None and not spec.target.split(":", 1)[0].startswith(tuple(settings.target_prefixes)):
        allowed = ", ".join(settings.target_prefixes)
        problems.append(f"target {spec.target!r} is outside the allowed handler modules ({allowed}; TARGET_PREFIXES)")
    elif spec.target is not None and (spec.backend or settings.backend) in ("process", "ray"):
        module = spec.target.split(":", 1)[0]
        if not module_exists(module):  # a docker image brings its own code: only the host's modules are checked
            problems.append(f"target {spec.target!r}: no module {module!r} on the gateway's Python path")
    for name in spec.env:
        if any(fnmatch.fnmatchcase(name.upper(), p) for p in ENV_DENY):
            problems.append(f"env {name!r} changes how a program starts and is never allowed")
        elif not any(fnmatch.fnmatchcase(name, p) for p in settings.env_allow):
            problems.append(f"env {name!r} is not on the allow-list ({', '.join(settings.env_allow)}; ENV_ALLOW)")
    if spec.max_instances > settings.max_instances:
        problems.append(f"max_instances {spec.max_instances} is over the gateway's cap of {settings.max_instances}")
    if spec.resources.memory_bytes > settings.max_instance_memory_bytes:
        problems.append(
            f"resources.memory_bytes {spec.resources.memory_bytes} is over the gateway's cap of "
            f"{settings.max_instance_memory_bytes}"
        )
    if problems:
        raise HTTPException(422, "; ".join(problems) + " (gateway settings: STELLARIS_GATEWAY_*)")
