"""The invocation gateway: `create_app(settings)`, thin routes over the registry, warm pools, activations, metrics.

Routes follow OpenFaaS (POST /function/{name}, POST /async-function/{name}, /system/functions) with OpenWhisk
activation records and Lambda-style status codes (SPEC.md §6).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import aiohttp
import redis
import redis.asyncio as aioredis
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.routing import Route

from cache import Cache, CacheSettings
from cache.keys import GatewayKeys
from cache.retry import AsyncReconnectRetry
from gateway.activations import ActivationStore
from gateway.backends.base import Backend
from gateway.backends.process import ProcessBackend
from gateway.limits import ERROR_KINDS, BodyLimit, TooDeep, check_registration, parse_json
from gateway.metering import Metrics, charge
from gateway.models import Activation, FunctionSpec, Status
from gateway.pool import FunctionPool, InvocationFailed, Outcome, QueueFull
from gateway.registry import Registry
from gateway.settings import GatewaySettings

# The metering part of the activation record rides on the synchronous answer, so a caller that accounts for
# cost (the control plane) needs no second request per call.
METER_HEADER = "X-Activation-Meter"
METER_FIELDS = {"start", "end", "cold", "init_s", "wait_s", "duration_s", "instance", "resource_seconds", "cost_usd"}


class PrewarmRequest(BaseModel):
    count: int = Field(ge=1, le=1024, description="instances wanted warm")
    by_s: float | None = Field(default=None, ge=0, description="seconds from now; None: as soon as possible")
    wait_s: float = Field(default=0.0, ge=0, le=600, description="hold the answer until they are up (bounded)")


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


class Gateway:
    """Everything a running gateway holds; created in the app's lifespan."""

    def __init__(self, settings: GatewaySettings, backends: dict[str, Backend] | None = None) -> None:
        self.settings = settings
        self.keys = GatewayKeys(settings.namespace)
        self.metrics = Metrics()
        self.pools: dict[str, FunctionPool] = {}
        self.spec_seen: dict[str, float] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._backends = backends or {}
        self.cache: Cache | None = None

    async def start(self) -> None:
        self.cache = Cache(CacheSettings(url=self.settings.redis_url) if self.settings.redis_url else None)
        # A bounded pool that makes a request wait for a free connection (up to redis_wait_s) rather than fail.
        retry = AsyncReconnectRetry(self.cache.settings.reconnect_window_s, check=self.cache.retry.check)
        retry.armed = True  # the cache above has reached the server
        pool = aioredis.BlockingConnectionPool.from_url(
            self.cache.url,
            max_connections=self.settings.redis_max_connections,
            timeout=self.settings.redis_wait_s,
            retry=retry,
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self.registry = Registry(self.redis, self.keys)
        self.activations = ActivationStore(
            self.redis, self.keys, ttl_s=self.settings.activation_ttl_s, max_records=self.settings.activation_max
        )
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None))
        self._backends.setdefault("process", ProcessBackend(redis_url=self.cache.url))
        for spec in await self.registry.all():
            pool = self._pool_for(spec)
            pool.adopt(await asyncio.to_thread(pool.backend.discover))
            self.spawn(pool.ensure_min_warm())

    async def stop(self) -> None:
        await self.activations.drain()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        # Process instances never outlive the gateway; containers stay up to be found again by label.
        await asyncio.gather(*(p.close(stop_instances=p.backend.name == "process") for p in self.pools.values()))
        await self.http.close()
        await self.redis.aclose()
        if self.cache is not None:
            self.cache.close()

    def backend(self, name: str) -> Backend:
        if name not in self._backends:
            if name != "docker":
                raise HTTPException(422, f"unknown backend {name!r}")
            from gateway.backends.docker import DockerBackend

            st = self.settings
            self._backends[name] = DockerBackend(
                redis_url=self.cache.url if self.cache else None,
                python=st.docker_python,
                volumes=st.docker_volumes or None,
                working_dir=st.docker_workdir,
            )
        return self._backends[name]

    def _pool_for(self, spec: FunctionSpec) -> FunctionPool:
        pool = FunctionPool(spec, self.backend(spec.backend), self.http, self.metrics)
        self.pools[spec.name] = pool
        self.spec_seen[spec.name] = time.monotonic()
        return pool

    async def pool(self, name: str) -> FunctionPool:
        """This worker's pool for `name`, refreshed from the shared registry when it may be stale."""
        pool = self.pools.get(name)
        if pool is not None and time.monotonic() - self.spec_seen[name] < self.settings.spec_refresh_s:
            return pool
        spec = await self.registry.get(name)
        if spec is None:
            if pool is not None:
                self.spawn(self.drop(name))
            raise HTTPException(404, f"no function named {name!r}")
        if pool is not None and pool.spec == spec:
            self.spec_seen[name] = time.monotonic()
            return pool
        if pool is not None:
            self.spawn(pool.close())
        return self._pool_for(spec)

    async def drop(self, name: str) -> None:
        pool = self.pools.pop(name, None)
        self.spec_seen.pop(name, None)
        if pool is not None:
            await pool.close()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def run(
        self, pool: FunctionPool, act: Activation, event: dict[str, Any], *, admitted: bool = False
    ) -> tuple[int, dict[str, Any]]:
        """Invoke and complete the activation record; returns (HTTP status, body)."""
        name = pool.spec.name
        outcome: Outcome | None = None
        try:
            outcome = await pool.invoke(event, call_id=act.id, admitted=admitted)
            code, body = 200, outcome.result or {}
            act.status, act.result = Status.SUCCESS, outcome.result
        except InvocationFailed as failed:
            outcome = failed.outcome
            code, body = failed.status_code, {"error": failed.error}
            act.status, act.error = failed.status, failed.error
        act.end, act.status_code = time.time(), code
        if outcome is not None:
            act.instance, act.cold, act.init_s = outcome.instance, outcome.cold, outcome.init_s
            act.wait_s, act.duration_s = outcome.wait_s, outcome.duration_s
            act.resource_seconds, act.cost_usd = charge(outcome.duration_s, pool.spec.pricing)
            self.metrics.wait_seconds.labels(name).observe(outcome.wait_s)
            self.metrics.duration_seconds.labels(name).observe(outcome.duration_s)
            self.metrics.cost_usd.labels(name).inc(act.cost_usd)
        self.metrics.invocations.labels(name, str(code)).inc()
        return code, body


def _bearer_matches(request: Request, *tokens: str | None) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and any(
        t is not None and secrets.compare_digest(given.encode(), t.encode()) for t in tokens
    )


def authorised(request: Request) -> None:
    """The admin token (`token`): every route but health. No token configured: an open loopback gateway."""
    token = request.app.state.gateway.settings.token
    if token is not None and not _bearer_matches(request, token):
        raise HTTPException(401, "missing or bad bearer token (admin)", headers={"WWW-Authenticate": "Bearer"})


def may_invoke(request: Request) -> None:
    """Invoking and reading activations: the admin token or the invoke token (`invoke_token`)."""
    settings = request.app.state.gateway.settings
    if settings.token is not None and not _bearer_matches(request, settings.token, settings.invoke_token):
        raise HTTPException(401, "missing or bad bearer token", headers={"WWW-Authenticate": "Bearer"})


Auth = Annotated[None, Depends(authorised)]
InvokeAuth = Annotated[None, Depends(may_invoke)]


def create_app(
    settings: GatewaySettings | None = None,
    *,
    backends: dict[str, Backend] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    settings = settings or GatewaySettings()
    gw = Gateway(settings, backends)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await gw.stop()

    # The API description is behind the token like every route but /healthz, unless public_docs says otherwise.
    public = settings.public_docs
    app = FastAPI(
        title="Stellaris gateway", version="0.1.0", lifespan=lifespan, redoc_url=None,
        openapi_url="/openapi.json" if public else None, docs_url="/docs" if public else None,
    )  # fmt: skip
    app.state.gateway = gw
    if not public:

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(_: Auth) -> dict[str, Any]:
            return app.openapi()

        @app.get("/docs", include_in_schema=False)
        async def docs(_: Auth) -> Response:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="Stellaris gateway")

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, ERROR_KINDS.get(exc.status_code, "HTTPError"), str(exc.detail), exc.headers)

    @app.exception_handler(redis.RedisError)
    async def cache_unavailable(request: Request, exc: redis.RedisError) -> JSONResponse:
        # The gateway's own cache is unreachable or its connections are all busy: the gateway's fault, retryable.
        message = f"the gateway's cache is unavailable: {type(exc).__name__}: {exc}"
        return _error(503, "CacheUnavailable", message, {"Retry-After": "1"})

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # A body nested deeper than the JSON decoder can go, on a route that parses it into a model.
        return _error(400, "BadRequest", str(TooDeep(settings.max_json_depth).detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return _error(422, "ValidationError", problems)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "functions": len(gw.pools)}

    @app.get("/metrics")
    async def metrics(_: Auth) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- registry ---------------------------------------------------------------------------------------------
    @app.post("/system/functions", status_code=201)
    async def create_function(spec: FunctionSpec, _: Auth) -> dict[str, Any]:
        check_registration(spec, settings)
        if not await gw.registry.put(spec, create=True):
            raise HTTPException(409, f"function {spec.name!r} exists; use PUT to update it")
        pool = gw._pool_for(spec)
        started = await pool.ensure_min_warm()
        return {"function": spec.model_dump(), "warm_started": started}

    @app.put("/system/functions/{name}")
    async def update_function(name: str, spec: FunctionSpec, _: Auth) -> dict[str, Any]:
        if spec.name != name:
            raise HTTPException(422, f"name in the body ({spec.name!r}) differs from the path ({name!r})")
        check_registration(spec, settings)
        if await gw.registry.get(name) is None:
            raise HTTPException(404, f"no function named {name!r}")
        await gw.registry.put(spec, create=False)
        old = gw.pools.pop(name, None)
        if old is not None:
            gw.spawn(old.close())
        started = await gw._pool_for(spec).ensure_min_warm()
        return {"function": spec.model_dump(), "warm_started": started}

    @app.get("/system/functions")
    async def list_functions(_: Auth) -> list[dict[str, Any]]:
        return [s.model_dump() for s in await gw.registry.all()]

    @app.get("/system/functions/{name}")
    async def get_function(name: str, _: Auth) -> dict[str, Any]:
        pool = await gw.pool(name)
        return {"function": pool.spec.model_dump(), "status": pool.status()}

    @app.delete("/system/functions/{name}")
    async def delete_function(name: str, _: Auth) -> dict[str, Any]:
        if not await gw.registry.delete(name):
            raise HTTPException(404, f"no function named {name!r}")
        await gw.drop(name)
        return {"deleted": name}

    @app.post("/system/functions/{name}/prewarm", status_code=202)
    async def prewarm(name: str, req: PrewarmRequest, _: Auth) -> dict[str, Any]:
        return await (await gw.pool(name)).prewarm(req.count, by_s=req.by_s, wait_s=req.wait_s)

    # -- invocation -------------------------------------------------------------------------------------------
    async def event_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            event = parse_json(raw, settings.max_json_depth) if raw else {}
        except ValueError as exc:
            raise HTTPException(422, f"body: not valid JSON ({exc})") from exc
        if not isinstance(event, dict):
            raise HTTPException(422, f"body: the event must be a JSON object, got {type(event).__name__}")
        return event

    async def invoke(request: Request) -> Response:
        """POST /function/{name}: synchronous call. A plain Starlette route: this is the hot path, and FastAPI's
        dependency solving costs more than the rest of the gateway's work per call."""
        name = request.path_params["name"]
        try:
            may_invoke(request)
            pool = await gw.pool(name)
            event = await event_of(request)
        except HTTPException as exc:
            return await http_error(request, exc)
        act = Activation(id=uuid.uuid4().hex, function=name, status=Status.RUNNING, start=time.time())
        headers = {"X-Call-Id": act.id}
        try:
            code, body = await gw.run(pool, act, event)
        except QueueFull as full:
            gw.metrics.invocations.labels(name, "429").inc()
            return _error(429, "TooManyRequests", str(full), {**headers, "Retry-After": f"{full.retry_after_s:.0f}"})
        gw.activations.save_later(act)
        headers[METER_HEADER] = act.model_dump_json(include=METER_FIELDS)
        return Response(json.dumps(body), status_code=code, media_type="application/json", headers=headers)

    app.router.routes.insert(0, Route("/function/{name}", invoke, methods=["POST"]))

    @app.post(
        "/function/{name}",
        responses={200: {"description": "the handler's result"}, 404: {}, 422: {}, 429: {}, 502: {}, 504: {}},
    )
    async def invoke_documented(name: str, event: dict[str, Any], _: InvokeAuth) -> dict[str, Any]:
        """Synchronous invocation (OpenAPI entry only: the raw route above serves every request)."""
        raise HTTPException(500, "unreachable: served by the raw route")

    @app.post("/async-function/{name}", status_code=202)
    async def invoke_async(name: str, request: Request, _: InvokeAuth) -> JSONResponse:
        pool = await gw.pool(name)
        event = await event_of(request)
        try:
            pool.admit()  # decided now, before the 202: an accepted call is never rejected later
        except QueueFull as full:
            gw.metrics.invocations.labels(name, "429").inc()
            return _error(429, "TooManyRequests", str(full), {"Retry-After": f"{full.retry_after_s:.0f}"})
        act = Activation(id=uuid.uuid4().hex, function=name, status=Status.QUEUED, start=time.time())
        try:
            await gw.activations.save(act)
        except BaseException:
            pool.release_admission()
            raise

        async def background() -> None:
            await gw.run(pool, act, event, admitted=True)
            await gw.activations.save(act)

        gw.spawn(background())
        return JSONResponse({"activation_id": act.id}, status_code=202, headers={"X-Call-Id": act.id})

    @app.get("/activations/{activation_id}")
    async def activation(activation_id: str, _: InvokeAuth, wait_s: float = 0.0) -> dict[str, Any]:
        act = await gw.activations.wait(activation_id, min(max(wait_s, 0.0), 60.0))
        if act is None:
            raise HTTPException(404, f"no activation {activation_id!r} (unknown or expired)")
        return act.model_dump()

    return app
