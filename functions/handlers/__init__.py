"""The three serverless functions: `handle(event, ctx) -> dict`. Plumbing only: event -> cache -> compute -> cache."""

from __future__ import annotations

import os
import time
from typing import Any

from cache.acl import JOB_ENV


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


class Stopwatch:
    """Seconds spent inside `with watch:` blocks, summed: a handler's algorithm time, apart from its cache I/O."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0
