"""The three serverless functions: `handle(event, ctx) -> dict`. Plumbing only: event -> cache -> compute -> cache."""

from __future__ import annotations

from typing import Any


class EventError(ValueError):
    """An invocation event lacks a field or carries one of the wrong type."""


def job_id_of(event: dict[str, Any]) -> str:
    job = event.get("job")
    if not isinstance(job, str) or not job:
        raise EventError(f"event needs a 'job' field with the job id (a string), got {job!r}")
    return job
