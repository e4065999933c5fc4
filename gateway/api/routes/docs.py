"""The API description behind the admin token (unless `public_docs`, when FastAPI serves it itself)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html

from gateway.api.deps import Auth, AuthFirst

OPENAPI_URL = "/openapi.json"
router = APIRouter(include_in_schema=False, route_class=AuthFirst)


@router.get(OPENAPI_URL)
async def openapi(request: Request, _: Auth) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return schema


@router.get("/docs")
async def docs(request: Request, _: Auth) -> Response:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=request.app.title)
