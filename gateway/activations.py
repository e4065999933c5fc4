"""Activation records in the cache, bounded by age (a TTL) and by count (the oldest beyond `max_records` are
dropped); any worker can answer for any activation and wait for its end."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from pydantic import ValidationError

from cache.keys import GatewayKeys
from gateway.models import Activation, Status
from gateway.redis_client import GatewayRedis

FINAL = {Status.SUCCESS, Status.ERROR, Status.TIMEOUT, Status.REJECTED}
# How long a read with `wait_s` waits for a record that is not there yet: a synchronous call's record is written
# just after its answer leaves, by whichever worker answered, so a caller reading it at once from another worker can
# get there first. The write is one event-loop turn away; a record still absent after this is unknown or expired.
UNWRITTEN_GRACE_S = 1.0
log = logging.getLogger("stellaris.gateway")

# Drop the oldest records beyond the cap, and index entries older than the TTL (their records are gone). KEYS: index.
# ARGV: cap, record key prefix, ttl ms, oldest creation time kept (s). The record keys share the index's hash tag
# (one slot, cache/keys.py GatewayKeys), though they are named here rather than declared: fine on a Redis Cluster.
_TRIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if extra > 0 then
  local old = redis.call('ZRANGE', KEYS[1], 0, extra - 1)
  for _, id in ipairs(old) do
    redis.call('UNLINK', ARGV[2] .. id, ARGV[2] .. id .. ':done')
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return math.max(extra, 0)
"""


class ActivationStore:
    def __init__(
        self, client: GatewayRedis, keys: GatewayKeys, *, ttl_s: float, max_records: int, batch_max: int = 512
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.max_records = max_records
        self.batch_max = batch_max
        self._pending: list[Activation] = []
        self._flush: asyncio.Task[None] | None = None

    def save_later(self, act: Activation) -> None:
        """Queue a record written after the answer has left: one pipeline per event-loop turn, not per call."""
        self._pending.append(act)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.ensure_future(self._write_pending())

    async def _write_pending(self) -> None:
        await asyncio.sleep(0)  # let the other answers of this loop turn queue their records too
        while self._pending:
            batch, self._pending = self._pending[: self.batch_max], self._pending[self.batch_max :]
            async with self.client.pipeline(transaction=False) as pipe:
                for act in batch:
                    self._queue_writes(pipe, act)
                self._queue_trim(pipe)
                await pipe.execute()

    async def drain(self) -> None:
        if self._flush is not None:
            await self._flush
        await self._write_pending()

    def _queue_trim(self, pipe: Any) -> None:
        oldest = time.time() - self.ttl_ms / 1000
        keys, args = [self.keys.activations], [self.max_records, self.keys.activation(""), self.ttl_ms, oldest]
        pipe.eval(_TRIM, len(keys), *keys, *args)  # sent whole: a cluster pipeline takes no EVALSHA

    def _queue_writes(self, pipe: Any, act: Activation) -> None:
        pipe.zadd(self.keys.activations, {act.id: act.start}, nx=True)
        pipe.set(self.keys.activation(act.id), act.model_dump_json(), px=self.ttl_ms)
        if act.status in FINAL:
            pipe.rpush(self.keys.activation_done(act.id), 1)
            pipe.pexpire(self.keys.activation_done(act.id), self.ttl_ms)

    async def save(self, act: Activation) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            self._queue_writes(pipe, act)
            self._queue_trim(pipe)
            await pipe.execute()

    async def get(self, activation_id: str) -> Activation | None:
        raw = await self.client.get(self.keys.activation(activation_id))
        return None if raw is None else read_record(raw)

    async def wait(self, activation_id: str, timeout_s: float) -> Activation | None:
        """The record once final, or as it stands after `timeout_s` (blocks on a list, no polling)."""
        act = await self.get(activation_id)
        if act is None and (self._pending or (self._flush is not None and not self._flush.done())):
            # Maybe one of this worker's records written after its answer left (save_later): a caller reading it
            # right after that answer waits for the write rather than getting a 404.
            await self.drain()
            act = await self.get(activation_id)
        if act is None and timeout_s > 0 and _issued_here(activation_id):
            timeout_s = min(timeout_s, UNWRITTEN_GRACE_S)  # maybe another worker's record, about to be written
        elif act is None or act.status in FINAL or timeout_s <= 0:
            return act
        done = self.keys.activation_done(activation_id)
        # Moved onto itself, the wake-up is left for other readers. The ignore: BLMOVE's timeout is a float number of
        # seconds (Redis >= 6), which redis-py's stub types as int.
        await self.client.blmove(done, done, timeout_s, "LEFT", "RIGHT")  # type: ignore[arg-type]
        return await self.get(activation_id)


def read_record(raw: str | bytes) -> Activation:
    """A stored record, even one with fields that no longer validate (a record written before registrations were
    bounded: an infinite price stored its cost as `null`): those fields take their defaults, so that a reader gets
    the rest of the record rather than a 500. A record without a valid id, function or status still raises."""
    try:
        return Activation.model_validate_json(raw)
    except ValidationError:
        data = json.loads(raw)  # Python's decoder reads a bare Infinity or NaN too
        if not isinstance(data, dict):
            raise
    try:
        return Activation.model_validate(data)
    except ValidationError as exc:
        bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
        if not bad or bad & {"id", "function", "status"}:
            raise
    log.warning("activation record %r: unreadable %s read as the default", data["id"], ", ".join(map(str, bad)))
    return Activation.model_validate({k: v for k, v in data.items() if k not in bad})


def _issued_here(activation_id: str) -> bool:
    """Whether the id has the form the gateway gives activations (uuid4 hex): only those are worth waiting for."""
    return len(activation_id) == 32 and all(c in "0123456789abcdef" for c in activation_id)
