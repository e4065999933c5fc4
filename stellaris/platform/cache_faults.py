"""What the cache's state says about a job that failed, so the run reports the cause rather than whichever call failed
first (a function's 502, a 404, NOGROUP on a stream):

- A Redis that came back without the job's data (restarted without persistence, flushed, failed over to an empty
  replica) ends the job's epoch, not the run: `stellaris train` resumes from the run's last checkpoint in a new
  epoch, as `--resume` would, at most $STELLARIS_CACHE_LOSS_RESUMES times in one command (default 3; 0: the run
  ends and says how to resume it).
- A Redis out of memory (`maxmemory` reached, writes refused) ends the run, naming its memory and what to change.
"""

from __future__ import annotations

import redis

from cache import CacheError, JobCache
from stellaris.platform.env_limits import count_from_env

RESUMES_ENV = "STELLARIS_CACHE_LOSS_RESUMES"
DEFAULT_RESUMES = 3
MAX_RESUMES = 1000
FULL_FRACTION = 0.95


class CacheLost(RuntimeError):
    """The cache no longer holds the job's data; the message names the Redis (without its password) and the job."""


class CacheFull(RuntimeError):
    """The cache refuses writes: it reached its maxmemory. The message names the Redis and its memory."""


def resumes_from_env() -> int:
    """How many cache losses one `stellaris train` resumes from: $STELLARIS_CACHE_LOSS_RESUMES, default 3."""
    return count_from_env(RESUMES_ENV, DEFAULT_RESUMES, 0, MAX_RESUMES)


def refused_for_memory(exc: BaseException) -> bool:
    """Whether `exc` carries Redis's refusal of a write at its maxmemory (however deep it was relayed: a function's
    502 quotes its handler's error)."""
    return "maxmemory" in str(exc)


def cache_lost(job: JobCache, where: str, exc: BaseException) -> CacheLost | None:
    """After `exc`: CacheLost when the cache answers but no longer holds the job's policy version, which the job
    writes when it starts and with every update (its keys live a day past the last write), else None. A cache that
    does not answer (within its reconnect window) leaves `exc` to speak for itself."""
    try:
        held = job.client.exists(job.keys.policy_version)
    except (redis.RedisError, CacheError):
        return None
    if held:
        return None
    return CacheLost(
        f"the Redis at {where} no longer holds job {job.keys.job}'s data (it restarted without persistence, or was "
        f"flushed); what failed first: {type(exc).__name__}: {str(exc)[:300]}"
    )


def cache_full(job: JobCache, where: str, exc: BaseException) -> CacheFull | None:
    """After `exc`: CacheFull when the cache has reached its `maxmemory` (writes are then refused: Stellaris's keys
    must not be evicted, so a Redis of its own runs with `noeviction`), else None."""
    try:
        memory = job.client.info("memory")
    except (redis.RedisError, CacheError):
        return None
    used, cap = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    # Where the error does not carry the refusal (an actor that died of it), memory at the cap says it: a write takes
    # more than the last 5 % holds.
    if not cap or (not refused_for_memory(exc) and used < FULL_FRACTION * cap):
        return None
    return CacheFull(
        f"the Redis at {where} is out of memory ({used / 2**20:.1f} MiB used of its maxmemory {cap / 2**20:.1f} "
        "MiB), so it refuses writes: give it more, or keep less there (fewer actors, a smaller replay capacity)"
    )
