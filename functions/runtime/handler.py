"""The handler boundary: load `package.module:function`, run it on an event, and turn every outcome into a status
and a JSON body (a handler's exception, a result that is not a JSON object) without ever raising."""

from __future__ import annotations

import importlib
import json
import logging
import traceback
from collections.abc import Callable
from typing import Any

from contract.errors import JobDataLost
from contract.runtime_http import ErrorType, RuntimeStatus
from functions.runtime.context import Context

Handler = Callable[[dict[str, Any], Context], dict[str, Any]]

TRACEBACK_LINES = 20
log = logging.getLogger("stellaris.runtime")


def load_handler(target: str) -> Handler:
    """Import `package.module:function` (the attribute may be dotted, e.g. `mod:Class.method`)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handler must look like 'package.module:function', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{target!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"{target!r} is not callable")
    return obj


def run_handler(handler: Handler, event: dict[str, Any], ctx: Context) -> tuple[int, bytes]:
    """Call the handler (on a pool thread); every outcome becomes a status and a JSON body."""
    try:
        result = handler(event, ctx)
    except JobDataLost as exc:  # the control plane reports the loss, once: one line here, and only at INFO
        log.info("handler ended: %s", exc)
        return RuntimeStatus.HANDLER_ERROR, error_body(type(exc).__name__, str(exc))
    except BaseException as exc:  # a thread boundary: not even SystemExit may take the server down
        log.exception("handler raised %s", type(exc).__name__)
        return RuntimeStatus.HANDLER_ERROR, error_body(type(exc).__name__, str(exc), traceback=_traceback_tail(exc))
    if not isinstance(result, dict):
        message = f"handler returned a {type(result).__name__}, not a dict (a JSON object)"
        return RuntimeStatus.HANDLER_ERROR, error_body(ErrorType.INVALID_RESULT, message)
    try:
        # Serialised here, off the loop: a large result would otherwise stall every other request.
        return RuntimeStatus.OK, json.dumps(result, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        log.error("handler result is not JSON: %s", exc)
        message = f"handler result is not JSON-serialisable: {exc}"
        return RuntimeStatus.HANDLER_ERROR, error_body(ErrorType.INVALID_RESULT, message)


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message, **extra}}).encode()


def _traceback_tail(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-TRACEBACK_LINES:])
