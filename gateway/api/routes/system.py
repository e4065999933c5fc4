"""Health (open to all) and Prometheus metrics (admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.api.deps import Auth, AuthFirst, GatewayDep

router = APIRouter(route_class=AuthFirst)


@router.get("/healthz")
async def healthz(gw: GatewayDep) -> dict[str, Any]:
    return {"status": "ok", "functions": len(gw.pools)}


@router.get("/metrics")
async def metrics(gw: GatewayDep, _: Auth) -> Response:
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)
