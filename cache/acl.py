"""Per-job Redis users: each job's functions connect as a user that may touch only that job's keys.

A job's keys all live under `stl:{<job>}:` (one hash tag), so one ACL key pattern covers them, including the keys
Lua scripts reach without declaring them. On a Redis Cluster, users are per node: the user is set and removed on
every master (a master added later gets it from the owner's connect hook, `regrant_on_connect`). The user may run
the data commands the cache uses and nothing administrative or dangerous (no FLUSHALL, CONFIG, KEYS, DEBUG, ACL,
...). Redis checks these rules inside scripts too. A Redis without ACLs (before 6.0) gets no per-job user:
`supported` says so and callers fall back to the shared credentials (the README says what that means).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from urllib.parse import quote, urlsplit, urlunsplit

import redis
import redis.cluster

from cache.keys import PREFIX, validate_job_id

# The job an instance is bound to (set with the job user's credentials; functions.handlers.job_id_of reads it).
JOB_ENV = "STELLARIS_JOB"

# What a job's functions need: reads and writes of their own keys, streams, scripts, blocking pops, PING; and
# CLUSTER SLOTS, from which a cluster client learns which master holds which slots (an admin command otherwise).
_RULES = ("+@all", "-@admin", "-@dangerous", "+client|setinfo", "+client|setname", "+cluster|slots")


def job_user(job: str) -> str:
    return f"stl-job-{validate_job_id(job)}"


def _everywhere(client: redis.Redis | redis.cluster.RedisCluster) -> dict[str, str]:
    """Options that send an ACL command to every master of a cluster (a single server: none)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return {"target_nodes": redis.cluster.RedisCluster.PRIMARIES}
    return {}


def supported(client: redis.Redis | redis.cluster.RedisCluster) -> bool:
    try:
        client.execute_command("ACL", "WHOAMI")
    except redis.ResponseError:
        return False
    return True


def setuser_command(job: str, password: str) -> tuple[str, ...]:
    """The ACL SETUSER command that creates (or resets) the job's user with `password`; running it again is a no-op."""
    return ("ACL", "SETUSER", job_user(job), "reset", "on", f">{password}", f"~{PREFIX}:{{{job}}}:*", "resetchannels",
            *_RULES)  # fmt: skip


def grant_job(client: redis.Redis | redis.cluster.RedisCluster, job: str) -> tuple[str, str]:
    """Create (or reset) the job's user with a fresh random password; returns (user, password)."""
    password = secrets.token_hex(24)
    client.execute_command(*setuser_command(job, password), **_everywhere(client))
    return job_user(job), password


def regrant_on_connect(job: str, password: str) -> Callable[[redis.connection.AbstractConnection], None]:
    """A connect hook (`Cache.on_connect`) for the job's owner: ACL users live in memory, so a Redis restarted from
    its AOF has lost the job's user; the owner's first new connection sets it up again, with the same password, and
    the functions' retries then get in."""

    def regrant(conn: redis.connection.AbstractConnection) -> None:
        conn.send_command(*setuser_command(job, password))
        conn.read_response()

    return regrant


def revoke_job(client: redis.Redis | redis.cluster.RedisCluster, job: str) -> None:
    client.execute_command("ACL", "DELUSER", job_user(job), **_everywhere(client))


def url_as(url: str, user: str, password: str) -> str:
    """`url` with its credentials replaced by `user`:`password`."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))
