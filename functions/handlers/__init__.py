"""The three serverless functions: `handle(event, ctx) -> dict`. Plumbing only: event -> cache -> compute -> cache."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from cache.acl import JOB_ENV
from contract.errors import CacheError, JobDataLost

if TYPE_CHECKING:
    from functions.runtime.context import Context

Handler = Callable[[dict[str, Any], "Context"], dict[str, Any]]


class EventError(ValueError):
    """An invocation event lacks a field or carries one of the wrong type."""


def job_id_of(event: dict[str, Any]) -> str:
    """The job an invocation works on: the instance's own when it is bound to one ($STELLARIS_JOB, set by the control
    plane with the job's Redis credentials), which an event may repeat but not change; else the event's."""
    bound = os.environ.get(JOB_ENV)
    job = event.get("job", bound) if bound else event.get("job")
    if not isinstance(job, str) or not job:
        raise EventError(f"event needs a 'job' field with the job id (a string), got {job!r}")
    if bound and job != bound:
        raise EventError(f"this instance serves job {bound!r} only; the event names {job!r}")
    return job


def quiet_on_job_loss(handler: Handler) -> Handler:
    """`handler`, whose exception becomes `JobDataLost` (chained to it) when the job's data has meanwhile gone from
    the cache: the control plane reports that loss once, and the runtime logs no traceback for it. Only what a
    missing job's data causes is taken for it (a cache error, a missing key or record); a job's creation (`init`,
    before there is data to lose), a bad event and any other failure (a bad device, say) are left as they are."""

    @functools.wraps(handler)
    def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
        try:
            return handler(event, ctx)
        except (EventError, JobDataLost):
            raise
        except (CacheError, redis.RedisError, LookupError) as exc:
            if not _lost(event, ctx):
                raise
            lost = f"job {job_id_of(event)}'s data is gone from the cache (restarted empty, or flushed)"
            raise JobDataLost(f"{lost}; what failed: {type(exc).__name__}: {str(exc)[:300]}") from exc

    return handle


def _lost(event: dict[str, Any], ctx: Context) -> bool:
    """Whether the event's job has lost its data (False wherever that cannot be told: then the error stands)."""
    try:
        return not event.get("init") and ctx.job(job_id_of(event)).data_lost()
    except Exception:
        return False
