"""Which policy version each in-flight learner holds, so others can truncate against those policies (Eq. 2).

A learner's entry carries a lease deadline set from the server's clock; entries whose deadline passed (the learner
died without deregistering) are dropped on every read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from cache.keys import JobKeys
from cache.redis_types import RedisClient

_REGISTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""


def drop_expired_lua(learners: str, deadlines: str) -> str:
    """Lua that drops the entries whose lease ran out, for scripts that name the two keys at other KEYS slots."""
    return f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', {deadlines}, '-inf', now)
for _, id in ipairs(dead) do
  redis.call('HDEL', {learners}, id)
  redis.call('ZREM', {deadlines}, id)
end
"""


def snapshot_lua(learners: str, deadlines: str, tasks: str, closed: str, grad: str) -> str:
    """Lua whose value is a `WorkSnapshot` (expired learners dropped first): the parameter function's look at
    outstanding work, also returned by the publish script so that a publish needs no look of its own."""
    return drop_expired_lua(learners, deadlines) + (
        f"local snapshot = {{redis.call('XLEN', {tasks}), redis.call('HGETALL', {learners}), "
        f"redis.call('GET', {closed}) or '0', redis.call('XLEN', {grad})}}\n"
    )


class WorkSnapshot(NamedTuple):
    """One consistent look at a job's outstanding work."""

    tasks: int  # tasks on the task stream (a task leaves it when its gradient is stored or it is dead-lettered)
    held: list[int]  # the versions live learners hold, one per learner
    closed: int  # the newest closed round
    gradients: int  # gradients on the gradient stream

    @classmethod
    def from_reply(cls, raw: Any) -> WorkSnapshot:
        tasks, flat, closed, gradients = raw
        return cls(int(tasks), [int(flat[i + 1]) for i in range(0, len(flat), 2)], int(closed), int(gradients))


_HELD = drop_expired_lua("KEYS[1]", "KEYS[2]") + "return redis.call('HGETALL', KEYS[1])"

# One round trip (a transaction holding a script costs redis-py a SCRIPT EXISTS round trip on every execute).
_SNAPSHOT = snapshot_lua("KEYS[1]", "KEYS[2]", "KEYS[3]", "KEYS[4]", "KEYS[5]") + "return snapshot"


class LearnerRegistry:
    def __init__(self, client: RedisClient, keys: JobKeys, *, lease_s: float = 300.0, ttl_s: float = 86400.0):
        if lease_s <= 0:
            raise ValueError(f"learner lease_s must be positive, got {lease_s}")
        self.client = client
        self.keys = keys
        self.lease_ms = int(lease_s * 1000)
        self.ttl_ms = int(ttl_s * 1000)
        self._register = client.register_script(_REGISTER)
        self._held = client.register_script(_HELD)
        self._snapshot = client.register_script(_SNAPSHOT)

    def register(self, learner_id: str, version: int, *, lease_s: float | None = None) -> None:
        """Record (or refresh) that `learner_id` holds `version` until its lease runs out."""
        lease_ms = self.lease_ms if lease_s is None else int(lease_s * 1000)
        self._register(
            keys=[self.keys.learners, self.keys.learner_deadlines],
            args=[learner_id, int(version), lease_ms, self.ttl_ms],
        )

    def deregister(self, learner_id: str) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.learners, learner_id)
            pipe.zrem(self.keys.learner_deadlines, learner_id)
            pipe.execute()

    def in_flight(self) -> dict[str, int]:
        """Live learners and the version each holds (expired entries are dropped first)."""
        flat = self._held(keys=[self.keys.learners, self.keys.learner_deadlines])
        return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def work_snapshot(self) -> WorkSnapshot:
        """One consistent look at the job's outstanding work."""
        k = self.keys
        keys = [k.learners, k.learner_deadlines, k.tasks, k.tasks_closed, k.grad]
        return WorkSnapshot.from_reply(self._snapshot(keys=keys))

    def held_versions(self) -> list[int]:
        """Distinct policy versions held by live learners, ascending."""
        return sorted(set(self.in_flight().values()))
