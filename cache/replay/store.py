"""The replay store of one job: copies of landed trajectory batches, bounded by entry count, by payload bytes and
(FIFO) per actor, every step one Lua script (`scripts`), every key under the job's TTL.

A replayed batch's id is ``r<its stream id>``: the learners' batch lookup
(`cache.trajectories.TrajectoryQueue.get`) reads such an id from here, so a round's task can mix fresh and replayed
batches without any other change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis
from redis.typing import EncodableT

from cache.keys import JobKeys
from cache.redis_types import RedisClient, hash_fields, members
from cache.replay import scripts
from contract.errors import CacheError

REPLAY_PREFIX = "r"
_PARTS = ("data", "index", "order", "actors", "priority", "state")
_COUNTERS = ("seq", "evicted", "peak_bytes", "max_priority")  # of the state hash; "bytes" follows the entries


def replay_id(batch_id: str) -> str:
    """The replay id of a batch landed on the trajectory stream with id `batch_id`."""
    return batch_id if is_replay_id(batch_id) else f"{REPLAY_PREFIX}{batch_id}"


def is_replay_id(batch_id: str) -> bool:
    # A stream id starts with a digit (its milliseconds), so an id like an actor's "runner-..." is not taken for one.
    return batch_id.startswith(REPLAY_PREFIX) and batch_id[len(REPLAY_PREFIX) : len(REPLAY_PREFIX) + 1].isdigit()


@dataclass(frozen=True)
class ReplayEntry:
    """One held batch: replay id, the actor that collected it, arrival seq (1, 2, ...), payload bytes, priority."""

    rid: str
    actor: str
    seq: int
    size_bytes: int
    priority: float | None = None


@dataclass(frozen=True)
class StoreState:
    """The store's bookkeeping: payload bytes held now and at most so far, entries held and evicted so far."""

    entries: int
    bytes: int
    peak_bytes: int
    evicted: int


@dataclass(frozen=True)
class Added:
    added: bool  # False: it was in the store already
    evicted: int
    bytes: int


def _s(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class ReplayStore:
    """Bounds: `capacity` entries, `bytes_max` payload bytes (field names and values, as the stream holds them),
    `per_actor` entries of one actor (None: no per-actor bound). `prioritized`: new entries get a priority."""

    def __init__(
        self,
        client: RedisClient,
        keys: JobKeys,
        *,
        capacity: int = 256,
        bytes_max: int = 512 * 1024 * 1024,
        per_actor: int | None = None,
        prioritized: bool = False,
        ttl_s: float = 86400.0,
    ) -> None:
        for name, value in (("capacity", capacity), ("bytes_max", bytes_max), ("per_actor", per_actor or 1)):
            if value <= 0:
                raise ValueError(f"replay store: {name} must be positive, got {value}")
        self.client, self.keys = client, keys
        self.capacity, self.bytes_max, self.per_actor = capacity, bytes_max, per_actor
        self.prioritized = prioritized
        self.ttl_ms = int(ttl_s * 1000)
        self.k = [keys.replay(p) for p in _PARTS]
        self._add = client.register_script(scripts.ADD)
        self._update = client.register_script(scripts.UPDATE_PRIORITIES)
        self._read = client.register_script(scripts.READ)
        self._put = client.register_script(scripts.PUT)

    def add(self, batch_id: str, actor: str) -> Added:
        """Copy the landed batch `batch_id` (still on the trajectory stream) into the store, evicting atomically."""
        args: list[EncodableT] = [
            batch_id,
            replay_id(batch_id),
            actor,
            self.capacity,
            self.bytes_max,
            self.per_actor or 0,
        ]
        try:
            out = self._add(keys=[*self.k, self.keys.traj], args=[*args, self.ttl_ms, int(self.prioritized)])
        except redis.ResponseError as exc:
            raise CacheError(f"replay store: {exc}") from exc
        return Added(bool(out[0]), int(out[1]), int(out[2]))

    def put(self, entry: ReplayEntry, fields: Mapping[bytes, bytes]) -> Added:
        """Put back an entry a checkpoint kept, with its arrival seq and priority, evicting as `add` does."""
        prio = "" if entry.priority is None else repr(float(entry.priority))
        bounds = [self.capacity, self.bytes_max, self.per_actor or 0]
        flat = [x for kv in fields.items() for x in kv]
        try:
            out = self._put(keys=self.k, args=[entry.rid, entry.actor, entry.seq, *bounds, self.ttl_ms, prio, *flat])
        except redis.ResponseError as exc:
            raise CacheError(f"replay store: {exc}") from exc
        return Added(bool(out[0]), int(out[1]), int(out[2]))

    def counters(self) -> dict[str, str]:
        """The store's counters (arrival seq, evictions, peak bytes, highest priority): what a checkpoint keeps
        beside the entries, for `set_counters` to put back."""
        raw = self.client.hgetall(self.k[5])
        return {_s(k): _s(v) for k, v in raw.items() if _s(k) in _COUNTERS}

    def set_counters(self, counters: Mapping[str, str]) -> None:
        unknown = set(counters) - set(_COUNTERS)
        if unknown:
            raise ValueError(f"replay store: unknown counters {sorted(unknown)}, expected some of {list(_COUNTERS)}")
        if counters:
            self.client.hset(self.k[5], mapping=hash_fields(counters))
            self.client.pexpire(self.k[5], self.ttl_ms)

    def read(self, rid: str) -> dict[bytes, bytes] | None:
        """A stored batch's stream fields, None once it was evicted."""
        flat = self._read(keys=self.k[:2], args=[rid])
        if not flat:
            return None
        return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}

    def update_priorities(self, priorities: Mapping[str, float]) -> int:
        """Set the priorities of entries still held (ZADD XX: an evicted one is not written back). Returns how many."""
        bad = {rid: p for rid, p in priorities.items() if not p > 0.0 or p == float("inf")}
        if bad:
            raise ValueError(f"replay priorities must be positive and finite, got {bad}")
        pairs = [x for rid, p in priorities.items() for x in (replay_id(rid), repr(float(p)))]
        if not pairs:
            return 0
        return int(self._update(keys=self.k, args=[self.ttl_ms, *pairs]))

    def entries(self) -> list[ReplayEntry]:
        """Every held entry, oldest first, with its priority where it has one."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.k[1])
            pipe.zrange(self.k[4], 0, -1, withscores=True)
            index, prio = pipe.execute()
        priorities = {_s(rid): float(p) for rid, p in prio}
        out = []
        for rid_raw, rec in index.items():
            rid = _s(rid_raw)
            _sid, size, seq, actor = _s(rec).split("|", 3)
            out.append(ReplayEntry(rid, actor, int(seq), int(size), priorities.get(rid)))
        return sorted(out, key=lambda e: e.seq)

    def state(self) -> StoreState:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zcard(self.k[2])
            pipe.hmget(self.k[5], ["bytes", "peak_bytes", "evicted"])
            count, (nbytes, peak, evicted) = pipe.execute()
        return StoreState(int(count), int(nbytes or 0), int(peak or 0), int(evicted or 0))

    def check(self) -> list[str]:
        """Disagreements between the store's structures (for tests and tools): none when every step was atomic."""
        entries = self.entries()
        ids = {e.rid for e in entries}
        problems = []
        order = set(members(self.client.zrange(self.k[2], 0, -1)))
        actors = {m.rsplit("\0", 1)[-1] for m in members(self.client.zrange(self.k[3], 0, -1))}
        if order != ids or actors != ids:
            problems.append(f"index {sorted(ids)}, order {sorted(order)}, actors {sorted(actors)}")
        if self.client.xlen(self.k[0]) != len(ids):
            problems.append(f"data holds {self.client.xlen(self.k[0])} entries, index {len(ids)}")
        if sum(e.size_bytes for e in entries) != self.state().bytes:
            problems.append("bytes counter disagrees with the entries' sizes")
        if self.prioritized and {e.rid for e in entries if e.priority is not None} != ids:
            problems.append("priorities of entries not held, or entries without a priority")
        return problems


def read_batch_fields(client: RedisClient, keys: JobKeys, rid: str) -> dict[bytes, bytes] | None:
    """A replayed batch's fields by its replay id (what the learners' batch lookup calls)."""
    return ReplayStore(client, keys).read(rid)
