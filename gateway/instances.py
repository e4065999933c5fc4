"""A pool's live instance and the order in which idle ones are reused. A call may name an affinity key (the
`X-Affinity-Key` header): the instance that last served that key comes first, since what it keeps between calls
(a serverless actor's envs) is then where the call expects it; best effort, never a wait for a busy instance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.backends.base import InstanceHandle
from gateway.silence import Silence

MAX_AFFINITY_KEY_CHARS = 200


@dataclass
class Live:
    handle: InstanceHandle
    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    expiry: asyncio.TimerHandle | None = None
    affinity: str | None = None  # the key of the last call that named one
    silence: Silence = field(default_factory=Silence)  # its unanswered health probes in a row (gateway/hung.py)
    hung_s: float | None = None  # killed as hung after this long without an answer


def reuse_order(instances: Iterable[Live], affinity: str | None) -> list[Live]:
    """The instance that last served `affinity`, then those no key has claimed, then the rest; each group most
    recently used first, so surplus instances stay idle long enough to expire."""

    def rank(live: Live) -> tuple[int, float]:
        group = 0 if affinity is not None and live.affinity == affinity else 1 if live.affinity is None else 2
        return group, -live.idle_since

    return sorted(instances, key=rank)


def affinity_key(raw: str | None) -> str | None:
    """The header's value, checked: empty means none; a longer key than MAX_AFFINITY_KEY_CHARS is refused."""
    if not raw:
        return None
    if len(raw) > MAX_AFFINITY_KEY_CHARS:
        raise ValueError(f"X-Affinity-Key is {len(raw)} characters long; at most {MAX_AFFINITY_KEY_CHARS} are allowed")
    return raw
