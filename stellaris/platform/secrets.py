"""A run's config.yaml is its record: people read it, copy it and share it, so it keeps no secret. The Redis URL's
password and the gateway token are written as `***`. A resume (or a run from such a file) takes them from its flags
or the environment; given neither, it is refused with a line that says which to give. A run that resumes itself
in-process (stellaris/platform/cache_faults.py) still holds them."""

from __future__ import annotations

from typing import Any

from cache.connection import redact_url

REDACTED = "***"


def without_secrets(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (TrainConfig as JSON) as config.yaml keeps it."""
    kept = dict(config)
    if kept.get("redis_url"):
        kept["redis_url"] = redact_url(kept["redis_url"])
    if kept.get("gateway_token"):
        kept["gateway_token"] = REDACTED
    return kept


def missing_secret(redis_url: str | None, gateway_token: str | None) -> str | None:
    """What a config read back from config.yaml lacks to run, None when nothing."""
    if redis_url is not None and f":{REDACTED}@" in redis_url:
        return (
            f"the Redis URL {redis_url} comes without its password (a run's config.yaml keeps no secret): give it "
            "with --redis-url or REDIS_URL"
        )
    if gateway_token == REDACTED:
        return (
            "the gateway token comes as *** (a run's config.yaml keeps no secret): give it with --gateway-token or "
            "STELLARIS_GATEWAY_TOKEN"
        )
    return None
