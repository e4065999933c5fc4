"""Gradients stored by actors themselves (the ``gradients_at_actors`` distribution profile): the same gradient records
on the same stream the learners' `TaskBoard.claim` stores them on, so the parameter function applies them as it
applies any gradient (deleted atomically with the version they went into: exactly once).

There is no task to acknowledge, so a push is made idempotent another way: the script records each actor's last
stored task id and stores nothing when the same id comes again (a push whose reply was lost and that the client ran
again, cache/retry.py). An actor pushes one gradient at a time, so its last id is the only one a retry can repeat;
the record is one hash field per actor. A full gradient stream makes the actor wait for room (backpressure), as a
learner waits."""

from __future__ import annotations

import time

from cache.keys import JobKeys
from cache.redis_types import RedisClient
from cache.streams import blpop_timeout
from contract.errors import BackpressureTimeout
from contract.records import GradientRecord

# KEYS: gradients, pushers; ARGV: maxlen, ttl ms, actor id, task id, then the gradient's fields.
PUSH = """
if redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[4] then
  return {'dup'}
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return {'full'}
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {'ok', id}
"""


class ActorGradients:
    """One job's gradient stream as actors write it."""

    def __init__(self, client: RedisClient, keys: JobKeys, *, maxlen: int, ttl_s: float) -> None:
        if maxlen < 1:
            raise ValueError(f"gradient maxlen must be at least 1, got {maxlen}")
        self.client, self.keys, self.maxlen, self.ttl_ms = client, keys, maxlen, int(ttl_s * 1000)
        self._push = client.register_script(PUSH)

    def put(self, actor_id: str, record: GradientRecord, *, timeout_s: float) -> str | None:
        """Store `record` (its `meta.task_id` unique per gradient); None when it was already stored. Waits up to
        `timeout_s` for room in a full stream, then raises BackpressureTimeout."""
        k = self.keys
        args = [self.maxlen, self.ttl_ms, actor_id, record.meta.task_id, *record.fields()]
        deadline = time.monotonic() + timeout_s
        while True:
            raw = self._push(keys=[k.grad, k.gradient_pushers], args=args)
            if raw[0] == b"ok":
                return raw[1].decode() if isinstance(raw[1], bytes) else str(raw[1])
            if raw[0] == b"dup":
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackpressureTimeout(f"gradient stream {k.grad} stayed full ({self.maxlen}) for {timeout_s:.1f} s")
            self.client.blpop([k.freed(k.grad)], timeout=blpop_timeout(remaining))
