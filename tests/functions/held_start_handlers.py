"""A handler whose instances hold their start: importing this module tells Redis it began (pushes its PID to
`{STELLARIS_TEST_HELD_START_KEY}:started`) and then waits for `...:release`, so that a test can act while an instance
is starting."""

from __future__ import annotations

import os
from typing import Any

import redis

from functions.runtime.context import Context

_key = os.environ["STELLARIS_TEST_HELD_START_KEY"]
# The clients own socket timeout (5 s by default here) would cut the hold short: the BLPOP has its own.
with redis.Redis.from_url(os.environ["STELLARIS_TEST_HELD_START_REDIS"], socket_timeout=90) as _redis:
    _redis.rpush(f"{_key}:started", os.getpid())
    _redis.blpop([f"{_key}:release"], timeout=60)


def pid(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"pid": os.getpid()}
