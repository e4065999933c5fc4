"""A no-op handler: the gateway benchmark measures invocation overhead with it."""

from __future__ import annotations

from typing import Any


def handle(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {}
