"""The API description: FastAPI's own, plus the synchronous invocation route, which is a plain Starlette route (the
hot path skips FastAPI's dependency solving) and so is described here by hand."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

INVOKE_PATH = "/function/{name}"
INVOKE_OPERATION: dict[str, Any] = {
    "summary": "Invoke",
    "description": "Synchronous invocation: the handler's result, or a JSON error. The activation's metering "
    "(times, cold start, cost) rides in the X-Activation-Meter header, its id in X-Call-Id.",
    "operationId": "invoke_function__name__post",
    "parameters": [
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "title": "Name"}},
        {
            "name": "X-Affinity-Key",
            "in": "header",
            "required": False,
            "description": "reuse the idle instance that last served this key, if there is one",
            "schema": {"type": "string", "maxLength": 200},
        },
    ],
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True, "title": "Event"}}},
    },
    "responses": {
        "200": {
            "description": "the handler's result",
            "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}},
        },
        "400": {"description": "Bad Request (an over-long X-Affinity-Key)"},
        "401": {"description": "Unauthorized"},
        "404": {"description": "Not Found"},
        "422": {"description": "Unprocessable Entity"},
        "429": {"description": "Too Many Requests"},
        "502": {"description": "Bad Gateway"},
        "504": {"description": "Gateway Timeout"},
    },
}


def describe(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI schema (built once, then cached on the app), with the raw invocation route in it."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema.setdefault("paths", {})[INVOKE_PATH] = {"post": INVOKE_OPERATION}
        app.openapi_schema = schema
    return app.openapi_schema
