"""Per-job Redis users: each job's functions connect as a user that may touch only that job's keys.

A job's keys all live under `stl:{<job>}:` (one hash tag), so one ACL key pattern covers them, including the keys
Lua scripts reach without declaring them. On a Redis Cluster, users are per node: the user is set and removed on
every master (a master added later gets it from the owner's connect hook, `regrant_on_connect`). The user may run
the data commands the cache uses and nothing administrative or dangerous (no FLUSHALL, CONFIG, KEYS, DEBUG, ACL,
...). Redis checks these rules inside scripts too. A Redis without ACLs (before 6.0) gets no per-job user:
`supported` says so and callers fall back to the shared credentials (docs/reliability.md says what that means).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import redis
import redis.cluster

from cache.keys import PREFIX, validate_job_id

# The job an instance is bound to (set with the job user's credentials; functions.handlers.job_id_of reads it).
JOB_ENV = "STELLARIS_JOB"

# What a job's functions need: reads and writes of their own keys, streams, scripts, blocking pops, PING; and
# CLUSTER SLOTS, from which a cluster client learns which master holds which slots (an admin command otherwise).
_RULES = ("+@all", "-@admin", "-@dangerous", "+client|setinfo", "+client|setname", "+cluster|slots")
# Commands no category above takes away that see or change what lies outside the job's keys: the keyspace at large
# (SCAN, RANDOMKEY, DBSIZE), the server's memory, every client's scripts and functions (SCRIPT FLUSH or KILL,
# FUNCTION), keys read by pattern (SORT ... BY/GET), the channels in use. A job loads its own scripts (SCRIPT LOAD,
# EXISTS), which Redis checks command by command when they run. Redis 6.2 can only add a subcommand, not remove one:
# hence SCRIPT off, then two of its subcommands on. Commands the server does not know (FUNCTION before 7.0) are left
# out of the rules (`outside_rules`).
OUTSIDE_JOB = ("scan", "randomkey", "dbsize", "memory", "script", "function", "sort", "sort_ro", "pubsub", "lastsave")
_SCRIPTS_OWN = ("+script|load", "+script|exists")


def job_user(job: str) -> str:
    return f"stl-job-{validate_job_id(job)}"


def _one_node(client: redis.Redis | redis.cluster.RedisCluster) -> dict[str, str]:
    if isinstance(client, redis.cluster.RedisCluster):
        return {"target_nodes": redis.cluster.RedisCluster.RANDOM}
    return {}


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


def outside_rules(client: redis.Redis | redis.cluster.RedisCluster) -> tuple[str, ...]:
    """The rules that take OUTSIDE_JOB away from a job's user, for the commands this server knows."""
    names = set(client.execute_command("COMMAND", **_one_node(client)))  # redis-py: a dict by command name
    return (*(f"-{c}" for c in OUTSIDE_JOB if c in names), *(_SCRIPTS_OWN if "script" in names else ()))


def setuser_command(job: str, password: str, outside: tuple[str, ...]) -> tuple[str, ...]:
    """The ACL SETUSER command that creates (or resets) the job's user with `password`, less the commands `outside`
    takes away (`outside_rules`); running it again is a no-op."""
    return (
        "ACL",
        "SETUSER",
        job_user(job),
        "reset",
        "on",
        f">{password}",
        f"~{PREFIX}:{{{job}}}:*",
        "resetchannels",
        *_RULES,
        *outside,
    )


def grant_job(client: redis.Redis | redis.cluster.RedisCluster, job: str) -> Grant:
    """Create (or reset) the job's user with a fresh random password."""
    grant = Grant(job, secrets.token_hex(24), outside_rules(client))
    client.execute_command(*grant.command, **_everywhere(client))
    return grant


@dataclass(frozen=True)
class Grant:
    """A job's Redis user as granted: what re-creates it on a Redis that lost it (`regrant_on_connect`)."""

    job: str
    password: str
    outside: tuple[str, ...]

    @property
    def user(self) -> str:
        return job_user(self.job)

    @property
    def command(self) -> tuple[str, ...]:
        return setuser_command(self.job, self.password, self.outside)


def regrant_on_connect(grant: Grant) -> Callable[[redis.connection.AbstractConnection], None]:
    """A connect hook (`Cache.on_connect`) for the job's owner: ACL users live in memory, so a Redis restarted from
    its AOF has lost the job's user; the owner's first new connection sets it up again, with the same password, and
    the functions' retries then get in."""

    def regrant(conn: redis.connection.AbstractConnection) -> None:
        conn.send_command(*grant.command)
        conn.read_response()

    return regrant


def revoke_job(client: redis.Redis | redis.cluster.RedisCluster, job: str) -> None:
    client.execute_command("ACL", "DELUSER", job_user(job), **_everywhere(client))


def url_as(url: str, user: str, password: str) -> str:
    """`url` with its credentials replaced by `user`:`password`."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


def url_without_credentials(url: str) -> str:
    """`url` with no user or password: the address a function instance is given (its registration brings the job's
    own user, which `cache.connect` puts in), never the deployment's credentials, in the authority or the query."""
    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k.lower() not in ("username", "password")])
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}" + (f"?{query}" if query else "")
