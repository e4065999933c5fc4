"""One JSON error shape for every failure, `{"error": {"type", "message"}}`, whichever layer raised it."""

from __future__ import annotations

from collections.abc import Mapping

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.limits import ERROR_KINDS, TooDeep


def error_response(status: int, kind: str, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def http_error(exc: HTTPException) -> JSONResponse:
    return error_response(exc.status_code, ERROR_KINDS.get(exc.status_code, "HTTPError"), str(exc.detail), exc.headers)


def install_error_handlers(app: FastAPI, max_json_depth: int) -> None:
    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return http_error(exc)

    @app.exception_handler(redis.RedisError)
    async def cache_unavailable(request: Request, exc: redis.RedisError) -> JSONResponse:
        # The gateway's own cache is unreachable or its connections are all busy: the gateway's fault, retryable.
        message = f"the gateway's cache is unavailable: {type(exc).__name__}: {exc}"
        return error_response(503, "CacheUnavailable", message, {"Retry-After": "1"})

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # A body nested deeper than the JSON decoder can go, on a route that parses it into a model.
        return error_response(400, "BadRequest", str(TooDeep(max_json_depth).detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return error_response(422, "ValidationError", problems)
