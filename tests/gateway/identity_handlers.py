"""Handlers that answer differently and say who answered: the function (by its handler, not its name), the
instance (STELLARIS_INSTANCE_ID, set by both backends), the process and its warm call count. The restart tests
register each under its own function name and check that every call is answered by that function's instance."""

from __future__ import annotations

import os
from typing import Any

from functions.runtime.context import Context


def _identity(kind: str, ctx: Context) -> dict[str, Any]:
    return {
        "kind": kind,
        "instance": os.environ.get("STELLARIS_INSTANCE_ID"),
        "pid": os.getpid(),
        "calls": ctx.instance.invocations,
    }


def red(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return _identity("red", ctx)


def green(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return _identity("green", ctx)


def blue(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return _identity("blue", ctx)
