"""The versioned policy store: an integer version advanced atomically, and only by the holder of the update lease.

Weights of the newest `keep_versions` versions are kept (truncation needs the policies other learners hold); a
version leaving them is dropped at once unless a registered learner still holds it, which keeps it for a short
grace TTL, so at most K versions plus those held are stored. Optimizer state lives beside the policy and is
replaced in the same atomic step as the version, so the parameter function is stateless between invocations. Every
publish also appends to a small events stream that waiters block on (XREAD BLOCK), so nobody polls for new versions.
The atomic steps are Lua scripts in `cache.policy_scripts`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import redis

from cache import policy_scripts as scripts
from cache.keys import JobKeys
from cache.learner_registry import WorkSnapshot
from cache.redis_types import RedisClient, binary, read_entries, stream_entries
from cache.streams import MAX_BLOCK_S, Entry, blpop_timeout
from contract.errors import FencingError, LeaseUnavailable, VersionNotFound


class Published(NamedTuple):
    """What a publish returns: the new version, the work left right after it, and the gradients that landed after
    the last one the publisher had read (when it asked)."""

    version: int
    work: WorkSnapshot
    landed: list[Entry]


def _entry(raw_id: bytes, flat: list[bytes]) -> Entry:
    """A stream entry as a script's XRANGE returns it (its fields a flat list)."""
    return Entry(raw_id.decode(), {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)})


@dataclass(frozen=True)
class UpdateLease:
    """Proof of holding a job's update lease; `token` is a monotonically increasing fencing token."""

    owner: str
    token: int

    @property
    def value(self) -> str:
        return f"{self.owner}:{self.token}"


class PolicyStore:
    def __init__(
        self,
        client: RedisClient,
        keys: JobKeys,
        *,
        keep_versions: int = 8,
        ttl_s: float = 86400.0,
        retired_grace_s: float = 60.0,
    ) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be at least 1, got {keep_versions}")
        self.client = client
        self.keys = keys
        self.keep_versions = keep_versions
        self.ttl_ms = int(ttl_s * 1000)
        self.retired_grace_ms = int(retired_grace_s * 1000)
        self._init = client.register_script(scripts.INIT)
        self._release = client.register_script(scripts.RELEASE_LEASE)
        self._publish_ack = client.register_script(scripts.PUBLISH_ACK)
        self._refresh = client.register_script(scripts.REFRESH_LEASE)
        self._save_optim = client.register_script(scripts.SAVE_OPTIM)
        self._newer = client.register_script(scripts.NEWER)

    # -- reading ----------------------------------------------------------------------------------------------
    def version(self) -> int | None:
        """The newest published version, or None before `initialise`."""
        raw = self.client.get(self.keys.policy_version)
        return None if raw is None else int(raw)

    def get(self, version: int) -> bytes:
        blob = self.client.get(self.keys.policy(version))
        if blob is None:
            raise VersionNotFound(
                f"policy version {version} of job {self.keys.job!r} is not in the store "
                f"(only the newest {self.keep_versions} versions are kept)"
            )
        return binary(blob)

    def get_many(self, versions: list[int]) -> dict[int, bytes]:
        """Weights of the versions still stored (missing ones are left out)."""
        if not versions:
            return {}
        blobs = self.client.mget([self.keys.policy(v) for v in versions])
        return {v: binary(b) for v, b in zip(versions, blobs, strict=True) if b is not None}

    def latest(self) -> tuple[int, bytes]:
        """(version, weights) read consistently in one transaction."""
        for _ in range(16):
            version = self.version()
            if version is None:
                raise VersionNotFound(f"job {self.keys.job!r} has no policy yet")
            with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self.keys.policy_version)
                pipe.get(self.keys.policy(version))
                now, blob = pipe.execute()
            if now is not None and int(now) == version and blob is not None:
                return version, bytes(blob)
        raise VersionNotFound(f"job {self.keys.job!r}: the policy kept changing while being read")

    def newer_than(self, version: int | None) -> tuple[int, bytes] | None:
        """The newest (version, weights) unless the newest is `version` (then None): one round trip, so a caller
        holding a policy can look for a newer one often."""
        held = "" if version is None else str(version)
        raw = self._newer(keys=[self.keys.policy_version], args=[held, self.keys.policy(0)[:-1]])
        if not raw:
            raise VersionNotFound(f"job {self.keys.job!r} has no policy yet")
        if len(raw) == 1:
            return None
        if raw[1] is None:  # the newest version is never retired; only a deleted job gets here
            raise VersionNotFound(f"job {self.keys.job!r}: policy version {int(raw[0])} is gone from the store")
        return int(raw[0]), bytes(raw[1])

    def optimizer_state(self) -> bytes | None:
        blob = self.client.get(self.keys.optim)
        return None if blob is None else binary(blob)

    # -- writing ----------------------------------------------------------------------------------------------
    def initialise(self, weights: bytes, optimizer_state: bytes = b"", *, version: int = 0) -> int:
        """Store `version` (0 for a new job; a checkpoint's version on resume) unless the job already has a
        policy; returns the current version either way."""
        k = self.keys
        return int(
            self._init(
                keys=[k.policy_version, k.policy(version), k.optim, k.policy_events],
                args=[weights, optimizer_state, self.ttl_ms, version],
            )
        )

    def acquire(self, owner: str, *, lease_s: float = 30.0, wait_s: float = 0.0) -> UpdateLease:
        """Take the job's update lease, waiting up to `wait_s` for a holder to release it (no polling)."""
        deadline = time.monotonic() + wait_s
        while True:
            token = int(self.client.incr(self.keys.update_fence))
            self.client.pexpire(self.keys.update_fence, self.ttl_ms)
            lease = UpdateLease(owner=owner, token=token)
            if self.client.set(self.keys.update_lock, lease.value, nx=True, px=int(lease_s * 1000)):
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                holder = self.client.get(self.keys.update_lock)
                raise LeaseUnavailable(f"job {self.keys.job!r}: update lease held by {holder!r}")
            # A release pushes to this list; a holder that dies is covered by the lease TTL and the timeout.
            lock_ttl_s = max(self.client.pttl(self.keys.update_lock), 1) / 1000
            self.client.blpop([self._released_key], timeout=blpop_timeout(min(remaining, lock_ttl_s)))

    @property
    def _released_key(self) -> str:
        return f"{self.keys.update_lock}:released"

    def release(self, lease: UpdateLease) -> bool:
        return bool(self._release(keys=[self.keys.update_lock, self._released_key], args=[lease.value, 60000]))

    def evict(self, owner: str) -> bool:
        """Release the lease `owner` holds, whatever its token: its holder is known to be gone (the platform killed
        its instance), so a replacement need not wait for the lease to run out. The token fences the old holder."""
        keys = [self.keys.update_lock, self._released_key]
        return bool(self._release(keys=keys, args=[owner, 60000, "owner"]))

    def publish(
        self, lease: UpdateLease, *, expected_version: int, weights: bytes, optimizer_state: bytes = b""
    ) -> int:
        """Store version `expected_version + 1` if `lease` still holds and nobody published in between."""
        return self.publish_and_ack(
            lease, expected_version=expected_version, weights=weights, optimizer_state=optimizer_state
        ).version

    def save_optimizer(self, lease: UpdateLease, *, version: int, optimizer_state: bytes) -> None:
        """Store the optimizer state that goes with `version` (publishes may leave it out to save the copy); refused
        (FencingError) unless the lease holds and `version` is still the newest."""
        k = self.keys
        try:
            keys = [k.policy_version, k.update_lock, k.optim]
            self._save_optim(keys=keys, args=[lease.value, version, optimizer_state, self.ttl_ms])
        except redis.ResponseError as exc:
            if "FENCE" in str(exc):
                raise FencingError(f"job {self.keys.job!r}: optimizer save refused: {exc}") from exc
            raise

    def refresh(self, lease: UpdateLease, *, lease_s: float) -> bool:
        """Extend a held lease (False when it was lost: it ran out and someone else may hold it now)."""
        return bool(self._refresh(keys=[self.keys.update_lock], args=[lease.value, int(lease_s * 1000)]))

    def publish_and_ack(
        self,
        lease: UpdateLease,
        *,
        expected_version: int,
        weights: bytes,
        optimizer_state: bytes = b"",
        gradient_ids: Sequence[str] = (),
        aggregator: Mapping[str, float | int | str] | None = None,
        record: Mapping[str, bytes | str | int | float] | None = None,
        applied_maxlen: int = 100_000,
        read_after: str | None = None,
        read_count: int = 256,
    ) -> Published:
        """`publish`, and in the same atomic step delete the gradients that went into this version, store the
        aggregator's state and append `record` (plus the new version) to the applied log. A crash before it
        changes nothing; after it, nothing is left to apply twice. Refused (FencingError) unless the lease holds,
        the version is `expected_version` and every gradient is still there.

        Returns the new version, the job's outstanding work right after the step (what
        `LearnerRegistry.work_snapshot` would say then) and, with `read_after`, the gradients newer than that entry id
        (at most `read_count`): the parameter function's next look and read cost no round trip."""
        k = self.keys
        new = expected_version + 1
        retired = new - self.keep_versions
        agg = [x for kv in (aggregator or {}).items() for x in kv]
        rec = [x for kv in (record or {}).items() for x in kv]
        try:
            version, snapshot, landed = self._publish_ack(
                keys=[
                    k.policy_version,
                    k.update_lock,
                    k.policy(new),
                    k.optim,
                    k.policy_events,
                    k.policy(retired) if retired >= 0 else k.policy(new),
                    k.grad,
                    k.freed(k.grad),
                    k.aggregator,
                    k.applied,
                    k.learners,
                    k.learner_deadlines,
                    k.tasks,
                    k.tasks_closed,
                ],
                args=[
                    lease.value,
                    expected_version,
                    weights,
                    optimizer_state,
                    self.ttl_ms,
                    self.retired_grace_ms,
                    applied_maxlen,
                    str(retired),
                    read_after or "",
                    read_count,
                    len(gradient_ids),
                    *gradient_ids,
                    len(agg) // 2,
                    *agg,
                    *rec,
                ],
            )
        except redis.ResponseError as exc:
            if "FENCE" in str(exc):
                raise FencingError(f"job {self.keys.job!r}: publish refused: {exc}") from exc
            raise
        return Published(int(version), WorkSnapshot.from_reply(snapshot), [_entry(i, f) for i, f in landed])

    # -- waiting ----------------------------------------------------------------------------------------------
    def wait_for_version(self, after: int, *, timeout_s: float) -> int | None:
        """Block until a version newer than `after` is published; return it, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        last = stream_entries(self.client.xrevrange(self.keys.policy_events, count=1))
        last_id = last[0][0] if last else "0-0"
        while True:
            current = self.version()
            if current is not None and current > after:
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            reply = self.client.xread(
                {self.keys.policy_events: last_id},
                count=64,
                block=max(1, int(min(remaining, MAX_BLOCK_S) * 1000)),
            )
            events = read_entries(reply)
            if events:
                last_id = events[-1][0]
                newest = max(int(f[b"v"]) for _, f in events)
                if newest > after:
                    return newest


def new_owner_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"
