"""Bounded Redis Streams with consumer groups: exact length caps, backpressure, blocking reads, ack, reclaim.

A producer never trims unread data: when a stream holds `maxlen` entries the add is refused inside Redis (Lua)
and the producer blocks on the stream's "freed" list (BLPOP) until a consumer acknowledges an entry, up to a
bounded wait that ends in `BackpressureTimeout`. Acknowledged entries are deleted, so a stream's length is the
work that is queued or in flight. Every key written here carries a TTL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from cache.redis_types import RedisClient, read_entries, stream_entries
from contract.errors import BackpressureTimeout, CacheError

# The longest single blocking call; longer waits loop, so a client's socket timeout never cuts one short.
MAX_BLOCK_S = 20.0
# The shortest BLPOP timeout sent: Redis reads a timeout that rounds to 0 ms (0.001 s or less) as "block forever".
MIN_BLOCK_S = 0.01
# A consumed-entry wait looks again this often when no freed token wakes it (several waiters share the tokens).
CONSUMED_POLL_S = 0.05


def blpop_timeout(remaining_s: float) -> float:
    """A BLPOP timeout for a wait with `remaining_s` left: never one Redis would take as forever, never over
    MAX_BLOCK_S."""
    return min(max(remaining_s, MIN_BLOCK_S), MAX_BLOCK_S)


# KEYS: stream. ARGV: maxlen, ttl ms, then the entry's field/value pairs.
_ADD = """
local n = tonumber(ARGV[1])
if redis.call('XLEN', KEYS[1]) >= n then return false end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', n, '*', unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

_ACK = """
local acked = 0
for i = 3, #ARGV do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    redis.call('LPUSH', KEYS[2], '1')
    acked = acked + 1
  end
end
if acked > 0 then
  redis.call('LTRIM', KEYS[2], 0, 1023)
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return acked
"""


Fields = Sequence[bytes | memoryview | str]  # flat field, value, field, value, ... as XADD takes them


@dataclass(frozen=True)
class Entry:
    """One stream entry: its id and its field -> value map (see `contract.codec.encode_fields`)."""

    id: str
    fields: dict[bytes, bytes]


def _entry(raw_id: bytes | str, fields: dict[bytes, bytes] | None) -> Entry | None:
    entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
    if not fields:
        return None  # deleted while pending
    return Entry(entry_id, fields)


class BoundedStream:
    """One stream plus one consumer group."""

    def __init__(
        self,
        client: RedisClient,
        key: str,
        *,
        group: str,
        maxlen: int,
        ttl_s: float,
        freed_key: str | None = None,
    ) -> None:
        if maxlen <= 0:
            raise ValueError(f"maxlen of stream {key} must be positive, got {maxlen}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s of stream {key} must be positive, got {ttl_s}")
        self.client = client
        self.key = key
        self.group = group
        self.maxlen = maxlen
        self.ttl_ms = int(ttl_s * 1000)
        self.freed_key = freed_key or f"{key}:freed"
        self._add = client.register_script(_ADD)
        self._ack = client.register_script(_ACK)
        self._group_ready = False

    def ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.key, self.group, id="0", mkstream=True)
            self.client.pexpire(self.key, self.ttl_ms)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    # -- producing --------------------------------------------------------------------------------------------
    def try_add(self, fields: Fields) -> str | None:
        """Append unless the stream is full (then None)."""
        self.ensure_group()
        try:
            result = self._add(keys=[self.key], args=[self.maxlen, self.ttl_ms, *fields])
        except redis.ResponseError as exc:
            raise CacheError(f"cannot add to stream {self.key}: {exc}") from exc
        if result is None:
            return None
        return result.decode() if isinstance(result, bytes) else str(result)

    def add(self, fields: Fields, *, timeout_s: float) -> str:
        """Append, waiting up to `timeout_s` for room (woken by acknowledgements, not by polling)."""
        deadline = time.monotonic() + timeout_s
        while True:
            entry_id = self.try_add(fields)
            if entry_id is not None:
                return entry_id
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackpressureTimeout(
                    f"stream {self.key} stayed full ({self.maxlen} entries) for {timeout_s:.1f} s: "
                    "consumers are not keeping up; raise its maxlen or add consumers"
                )
            self.client.blpop([self.freed_key], timeout=blpop_timeout(remaining))

    def wait_consumed(self, entry_id: str, *, timeout_s: float, poll_s: float = CONSUMED_POLL_S) -> bool:
        """Block until `entry_id` is acknowledged (gone from the stream); False on timeout. Woken by the freed list
        as `add` is; a token another waiter took costs at most `poll_s`."""
        deadline = time.monotonic() + timeout_s
        while self.client.xrange(self.key, entry_id, entry_id, count=1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.client.blpop([self.freed_key], timeout=blpop_timeout(min(remaining, poll_s)))
        return True

    # -- consuming --------------------------------------------------------------------------------------------
    def read(self, consumer: str, *, count: int = 1, block_s: float = 0.0) -> list[Entry]:
        """New entries for `consumer`, blocking up to `block_s` (0 = do not block) when none is ready."""
        self.ensure_group()
        deadline = time.monotonic() + block_s
        while True:
            remaining = deadline - time.monotonic()
            block_ms = int(min(max(remaining, 0.0), MAX_BLOCK_S) * 1000)
            reply = self.client.xreadgroup(self.group, consumer, {self.key: ">"}, count=count, block=block_ms or None)
            entries = [Entry(i, f) for i, f in read_entries(reply)]
            if entries or deadline - time.monotonic() <= 0:
                return entries

    def delivered(self, consumer: str, *, count: int) -> list[Entry]:
        """Entries delivered to `consumer` and not yet acknowledged (its pending list, oldest first), up to `count`."""
        self.ensure_group()
        reply = self.client.xreadgroup(self.group, consumer, {self.key: "0"}, count=count)
        return [Entry(i, f) for i, f in read_entries(reply)]

    def ack(self, entry_ids: Sequence[str]) -> int:
        """Acknowledge and delete entries; wakes producers waiting for room. Returns how many were pending."""
        if not entry_ids:
            return 0
        return int(self._ack(keys=[self.key, self.freed_key], args=[self.group, self.ttl_ms, *entry_ids]))

    def reclaim(self, consumer: str, *, min_idle_s: float, count: int = 16) -> list[Entry]:
        """Take over entries idle for `min_idle_s` in another consumer's pending list (that consumer died)."""
        self.ensure_group()
        reply = self.client.xautoclaim(
            self.key, self.group, consumer, min_idle_time=int(min_idle_s * 1000), start_id="0-0", count=count
        )
        return [Entry(i, f) for i, f in stream_entries(reply[1] if reply else None)]

    def get(self, entry_id: str) -> Entry | None:
        """Read one entry by id without consuming it (None when it is gone)."""
        items = stream_entries(self.client.xrange(self.key, min=entry_id, max=entry_id, count=1))
        return Entry(*items[0]) if items else None

    # -- introspection ----------------------------------------------------------------------------------------
    def length(self) -> int:
        return int(self.client.xlen(self.key))

    def pending(self) -> int:
        """Entries delivered to a consumer and not yet acknowledged."""
        self.ensure_group()
        info = self.client.xpending(self.key, self.group)
        return int(info["pending"])

    def consumer_pending(self) -> dict[str, int]:
        self.ensure_group()
        info = self.client.xpending(self.key, self.group)
        return {
            c["name"].decode() if isinstance(c["name"], bytes) else c["name"]: int(c["pending"])
            for c in info.get("consumers", [])
        }
