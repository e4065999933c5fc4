"""`overrides:` (YAML and `--set`) checked before anything starts, each problem named as the user wrote it.

This is a local check in the user's process, as stellaris/env_check.py's are: it resolves the job request with the
same pure function the parameter function runs (functions.jobspec.resolve: preset + overrides -> a validated
JobSpec; no cache, no gateway, no job), so what passes here passes there. The control plane (stellaris/control/)
still reaches functions only through the gateway; this module only validates a request before one exists.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def override_problems(request: dict[str, Any]) -> str | None:
    """None if the job request resolves, else one line: `overrides.<field as written>: <what is wrong>`, each
    problem once (several joined by '; ')."""
    from functions.jobspec import JobRequest, resolve

    try:
        resolve(JobRequest.model_validate(request))
    except ValidationError as exc:
        seen: dict[str, None] = {}
        for error in exc.errors():
            where = ".".join(["overrides", *(str(part) for part in error["loc"])])
            seen[f"{where}: {error['msg'].removeprefix('Value error, ')}"] = None
        return "; ".join(seen)
    return None
