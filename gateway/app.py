"""The invocation gateway: `create_app(settings)`, the FastAPI template's shape. Routes live in gateway/api/routes/
and stay thin; the running gateway (gateway/service.py), the warm pools and the backends hold the logic.

Routes follow OpenFaaS (POST /function/{name}, POST /async-function/{name}, /system/functions) with OpenWhisk
activation records and Lambda-style status codes (docs/gateway.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.api import openapi
from gateway.api.errors import install_error_handlers
from gateway.api.routes import docs, functions, invoke, system
from gateway.backends.base import Backend
from gateway.limits import BodyLimit
from gateway.service import Gateway
from gateway.settings import GatewaySettings


def create_app(
    settings: GatewaySettings | None = None,
    *,
    backends: dict[str, Backend] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    settings = settings or GatewaySettings()
    gateway = Gateway(settings, backends)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await gateway.stop()

    # The API description is behind the token like every route but /healthz, unless public_docs says otherwise.
    public = settings.public_docs
    app = FastAPI(
        title="Stellaris gateway",
        version="0.1.0",
        lifespan=lifespan,
        redoc_url=None,
        openapi_url=docs.OPENAPI_URL if public else None,
        docs_url="/docs" if public else None,
    )
    app.state.gateway = gateway
    app.openapi = lambda: openapi.describe(app)  # type: ignore[method-assign]
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    install_error_handlers(app, settings.max_json_depth)
    if not public:
        app.include_router(docs.router)
    app.router.routes.extend(invoke.raw_routes)
    for group in (system, functions, invoke):
        app.include_router(group.router)
    return app
