"""The function registry (OpenFaaS's /system/functions) and pre-warming; admin only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from gateway.api.deps import Auth, AuthFirst, GatewayDep
from gateway.models import FunctionSpec

router = APIRouter(prefix="/system/functions", route_class=AuthFirst)
PREWARM_BY_MAX_S = 86400.0


class PrewarmRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    count: int = Field(ge=1, le=1024, description="instances wanted warm")
    by_s: float | None = Field(
        default=None, ge=0, le=PREWARM_BY_MAX_S, description="seconds from now (at most a day); None: at once"
    )
    wait_s: float = Field(default=0.0, ge=0, le=600, description="hold the answer until they are up (bounded)")


@router.post("", status_code=201)
async def create_function(spec: FunctionSpec, gw: GatewayDep, _: Auth) -> dict[str, Any]:
    stored, started = await gw.create(spec)
    return {"function": stored.model_dump(), "warm_started": started}


@router.put("/{name}")
async def update_function(name: str, spec: FunctionSpec, gw: GatewayDep, _: Auth) -> dict[str, Any]:
    if spec.name != name:
        raise HTTPException(422, f"name in the body ({spec.name!r}) differs from the path ({name!r})")
    stored, started = await gw.replace(spec)
    return {"function": stored.model_dump(), "warm_started": started}


@router.get("")
async def list_functions(gw: GatewayDep, _: Auth) -> list[dict[str, Any]]:
    return [s.model_dump() for s in await gw.registry.all()]


@router.get("/{name}")
async def get_function(name: str, gw: GatewayDep, _: Auth) -> dict[str, Any]:
    pool = await gw.pool(name)
    return {"function": pool.spec.model_dump(), "status": pool.status()}


@router.delete("/{name}")
async def delete_function(name: str, gw: GatewayDep, _: Auth) -> dict[str, Any]:
    await gw.delete(name)
    return {"deleted": name}


@router.post("/{name}/prewarm", status_code=202)
async def prewarm(name: str, req: PrewarmRequest, gw: GatewayDep, _: Auth) -> dict[str, Any]:
    return await (await gw.pool(name)).prewarm(req.count, by_s=req.by_s, wait_s=req.wait_s)
