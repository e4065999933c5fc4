"""Tiny handlers for the runtime tests; each test serves one of them in its own runtime process."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from functions.context import Context


def echo(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    ctx.log.info("echo of %d key(s)", len(event))
    return {"event": event, "call_id": ctx.call_id}


def fail(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    raise ValueError(event.get("message", "bad value"))


def sleep(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    time.sleep(float(event["seconds"]))
    return {"slept_s": event["seconds"]}


def bad_result(event: dict[str, Any], ctx: Context) -> Any:
    """Something that is not a JSON object: a list, a set inside a dict, or NaN (not valid JSON)."""
    return {"list": [1, 2], "set": {"value": {1, 2}}, "nan": {"loss": math.nan}}[event["kind"]]


def crash(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    os._exit(int(event.get("code", 3)))


def count(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The invocations its instance has served: warm state that must survive between invocations."""
    return {"calls": ctx.instance.invocations, "pid": os.getpid()}


def wait_for_release(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Announce the start on `started_key`, then block on `release_key` (BLPOP): a call the test controls."""
    client = ctx.instance.cache.client
    client.rpush(event["started_key"], ctx.call_id)
    released = client.blpop([event["release_key"]], timeout=float(event.get("timeout_s", 10)))
    return {"released": released is not None}
