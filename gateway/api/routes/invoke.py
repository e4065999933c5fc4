"""Invocation: synchronous (POST /function/{name}), asynchronous (POST /async-function/{name}, 202 and an
activation id) and the activation records (GET /activations/{id}); the admin or the invoke token."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

from contract.runtime_http import CALL_ID_HEADER, RETRY_AFTER_HEADER
from gateway.admission import PoolFull
from gateway.api.deps import (
    AuthFirst,
    GatewayDep,
    InvokeAuth,
    get_gateway,
    may_invoke,
    read_affinity,
    read_event,
    shown_error,
)
from gateway.api.errors import error_response, http_error
from gateway.models import METER_FIELDS, METER_HEADER, Activation, Status

ACTIVATION_WAIT_MAX_S = 60.0
router = APIRouter(route_class=AuthFirst)


def _too_many(full: PoolFull, headers: dict[str, str]) -> JSONResponse:
    retry = {RETRY_AFTER_HEADER: f"{full.retry_after_s:.0f}"}
    return error_response(429, "TooManyRequests", str(full), {**headers, **retry})


async def invoke(request: Request) -> Response:
    """POST /function/{name}: synchronous call. A plain Starlette route: this is the hot path, and FastAPI's
    dependency solving costs more than the rest of the gateway's work per call (gateway/api/openapi.py describes
    it)."""
    gw = get_gateway(request)
    name = request.path_params["name"]
    try:
        may_invoke(request)
        pool = await gw.pool(name)
        event, affinity = await read_event(request), read_affinity(request)
    except HTTPException as exc:
        return http_error(exc)
    act = Activation(id=uuid.uuid4().hex, function=name, status=Status.RUNNING, start=time.time())
    headers = {CALL_ID_HEADER: act.id}
    try:
        code, body = await gw.run(pool, act, event, affinity=affinity)
    except PoolFull as full:
        gw.metrics.invocations.labels(name, "429").inc()
        return _too_many(full, headers)
    gw.activations.save_later(act)
    headers[METER_HEADER] = act.model_dump_json(include=METER_FIELDS)
    if code != 200:  # a failure: the record keeps all of its error, the caller sees what its token may
        body = {"error": shown_error(request, body.get("error"))}
    return Response(json.dumps(body), status_code=code, media_type="application/json", headers=headers)


raw_routes = [Route("/function/{name}", invoke, methods=["POST"])]


@router.post("/async-function/{name}", status_code=202)
async def invoke_async(name: str, request: Request, gw: GatewayDep, _: InvokeAuth) -> JSONResponse:
    pool = await gw.pool(name)
    event, affinity = await read_event(request), read_affinity(request)
    try:
        pool.admission.admit()  # decided now, before the 202: an accepted call is never rejected later
    except PoolFull as full:
        gw.metrics.invocations.labels(name, "429").inc()
        return _too_many(full, {})
    act = Activation(id=uuid.uuid4().hex, function=name, status=Status.QUEUED, start=time.time())
    try:
        await gw.activations.save(act)
    except BaseException:
        pool.admission.release()
        raise

    async def background() -> None:
        await gw.run(pool, act, event, admitted=True, affinity=affinity)
        await gw.activations.save(act)

    gw.spawn(background())
    return JSONResponse({"activation_id": act.id}, status_code=202, headers={CALL_ID_HEADER: act.id})


@router.get("/activations/{activation_id}")
async def activation(
    activation_id: str,
    request: Request,
    gw: GatewayDep,
    _: InvokeAuth,
    wait_s: Annotated[float, Query(allow_inf_nan=False, description="clamped to 0..60")] = 0.0,
) -> dict[str, Any]:
    act = await gw.activations.wait(activation_id, min(max(wait_s, 0.0), ACTIVATION_WAIT_MAX_S))
    if act is None:
        raise HTTPException(404, f"no activation {activation_id!r} (unknown or expired)")
    return {**act.model_dump(), "error": shown_error(request, act.error)}
