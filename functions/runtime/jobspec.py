"""A job's spec (`contract.jobspec.JobSpec`) in the cache: written once when the job is created, read by every
handler of the job (never from its event). A spec an older version wrote (its horizon in `stellaris.horizon_rounds`)
loads with the horizon moved into its plan (`contract.jobspec.Plan`)."""

from __future__ import annotations

from cache import JobCache
from contract.jobspec import JobSpec


def save_spec(job: JobCache, spec: JobSpec) -> None:
    job.set_spec(spec.model_dump_json())


def load_spec(job: JobCache) -> JobSpec:
    raw = job.spec()
    if raw is None:
        raise LookupError(f"job {job.keys.job!r} has no spec in the cache; create the job first")
    return JobSpec.model_validate_json(raw)
