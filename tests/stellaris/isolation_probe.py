"""A user's environment that tries to break out of its job (the probe of issue 58, as a test's env): made inside a
job's instances (learner, parameter, actor), it reads its process environment for tokens and URLs, connects to
Redis with each one it finds (and as the default user with each value as a password), then tries to read, write and
SCAN another job's keys, and calls the gateway with each value as a bearer token. What it tried and every attempt
that got through goes to its own job's keys (the one place it may write), where the test reads it.

The env itself is PickTarget's (tests/stellaris/custom_env.py): the job learns as usual around the probe."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx
import redis

from cache.acl import JOB_ENV, url_as
from cache.connection import REDIS_URL_ENV, connect
from cache.keys import PREFIX, JobKeys
from tests.stellaris.custom_env import PickTarget

REPORT = "isolation-probe"  # under the job's own prefix: stl:{<job>}:isolation-probe
URL_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://")
_probed: list[int] = []  # the pid that probed already (a forked child probes again: it is another instance)


def report_key(job: str) -> str:
    return f"{PREFIX}:{{{job}}}:{REPORT}"


def _attempts(client: redis.Redis, victim: str) -> dict[str, Callable[[], Any]]:
    """Everything the probe tried against Redis, by what it is: each must be refused."""
    theirs = JobKeys(victim)
    return {
        "read the other job's policy version": lambda: client.get(theirs.policy_version),
        "write a key into the other job's namespace": lambda: client.set(report_key(victim) + ":breach", 1),
        "SCAN the keyspace": lambda: client.scan(0, count=1000),
        "KEYS *": lambda: client.keys("*"),
        "RANDOMKEY": client.randomkey,
        "DBSIZE": client.dbsize,
        "SCRIPT FLUSH": client.script_flush,
        "MEMORY STATS": client.memory_stats,
    }


def _redis_clients(env: dict[str, str]) -> dict[str, Callable[[], redis.Redis]]:
    """Each way into Redis the environment offers: every URL in it as it stands, the default user with every value
    as its password, and the instance's own connection (its job's user)."""
    ways: dict[str, Callable[[], redis.Redis]] = {}
    for name, value in env.items():
        if value.startswith(URL_SCHEMES) and "cluster" not in value:
            ways[f"the URL in ${name}"] = lambda v=value: redis.Redis.from_url(v, socket_timeout=5)
    if base := env.get(REDIS_URL_ENV):
        for name, value in env.items():
            if value and len(value) >= 8:
                url = url_as(base, "default", value)
                ways[f"the default user with ${name} as password"] = lambda u=url: redis.Redis.from_url(u)
    ways["the instance's own connection"] = lambda: connect().client
    return ways


def _tokens_at_gateway(env: dict[str, str], gateway_url: str, victim: str) -> list[str]:
    """Every value of the environment as the gateway's bearer token: listing functions (admin) or invoking the
    other job's (invoke) must be refused, 401 or 403."""
    got_through = []
    with httpx.Client(base_url=gateway_url, timeout=5) as http:
        for name, value in env.items():
            if not value or "\n" in value:
                continue
            auth = {"Authorization": f"Bearer {value}"}
            try:
                listed = http.get("/system/functions", headers=auth)
                invoked = http.post(f"/function/{victim}-learner", headers=auth, json={"job": victim})
            except httpx.HTTPError:  # not reachable from here: refused as well
                continue
            for what, answer in (("list the functions", listed), ("invoke the other job's learner", invoked)):
                if answer.status_code not in (401, 403):
                    got_through.append(f"${name} as a bearer token could {what} ({answer.status_code})")
    return got_through


def probe(victim: str, gateway_url: str) -> dict[str, Any]:
    env = dict(os.environ)
    breaches: list[str] = []
    tried = 0
    for way, open_client in _redis_clients(env).items():
        try:
            client = open_client()
            client.ping()
        except redis.RedisError:
            tried += 1
            continue
        for what, attempt in _attempts(client, victim).items():
            tried += 1
            try:
                attempt()
            except redis.RedisError:
                continue
            breaches.append(f"{way} could {what}")
    breaches += _tokens_at_gateway(env, gateway_url, victim)
    tried += 2 * len(env)
    return {"pid": os.getpid(), "argv": sys.argv, "env": env, "tried": tried, "breaches": breaches}


class BreakoutProbe(PickTarget):
    def __init__(self, victim: str, gateway_url: str, size: int = 2, episode_steps: int = 8) -> None:
        super().__init__(size=size, episode_steps=episode_steps)
        job = os.environ.get(JOB_ENV)
        if job is None or os.getpid() in _probed:  # the control plane (the job's owner) checks the env, unprobed
            return
        _probed.append(os.getpid())
        found = probe(victim, gateway_url)
        connect().client.rpush(report_key(job), json.dumps(found))
