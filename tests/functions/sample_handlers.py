"""Tiny handlers for the runtime tests; each test serves one of them in its own runtime process."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from functions.runtime.context import Context


def echo(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    ctx.log.info("echo of %d key(s)", len(event))
    return {"event": event, "call_id": ctx.call_id}


def fail(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    raise ValueError(event.get("message", "bad value"))


def sleep(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    time.sleep(float(event["seconds"]))
    return {"slept_s": event["seconds"]}


def spin(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Pure Python on the CPU for `seconds`: the handler thread wants the GIL all the time."""
    end, turns = time.monotonic() + float(event["seconds"]), 0
    while time.monotonic() < end:
        turns += 1
    return {"turns": turns}


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


def process(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """What the instance's process is: its pid and parent, working directory, data-segment limit and the env
    variables the event names."""
    import resource

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "rlimit_data": resource.getrlimit(resource.RLIMIT_DATA)[0],
        "gc_frozen": __import__("gc").get_freeze_count(),  # objects no full collection of this process walks
        "env": {name: os.environ.get(name) for name in event.get("env", [])},
        "torch_threads": __import__("torch").get_num_threads() if event.get("torch") else None,
        # A draw from NumPy's and torch's global generators, unseeded by the process itself.
        "draws": [float(__import__("numpy").random.random()), float(__import__("torch").rand(1))]
        if event.get("draw")
        else None,
    }
