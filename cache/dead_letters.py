"""A job's dead-letter stream (`JobKeys.dead_letters`): the entries given up on, each with its kind (task, gradient,
trajectory), id and reason. The control plane counts them per round (info.csv's `dead_lettered`). Tasks are given up
on by the task board's scripts (`cache.task_scripts`), gradients by the parameter function; a trajectory batch that
cannot be trained on is given up on here, by whoever claimed it (`cache.trajectories`)."""

from __future__ import annotations

from cache.keys import JobKeys
from cache.redis_types import RedisClient, stream_entries
from cache.streams import BoundedStream

# KEYS: stream, its freed list, dead letters. ARGV: group, entry id, reason, dead-letter maxlen, ttl ms, kind.
# Acknowledged, deleted (a producer waiting for room is woken) and dead-lettered at once, only while it is pending:
# a second give-up of the same entry does nothing.
_GIVE_UP = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, 1023)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'kind', ARGV[6], 'id', ARGV[2], 'reason', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
"""

# KEYS: stream, dead letters. ARGV: entry id, reason, dead-letter maxlen, ttl ms, kind. Only while it is there.
_DROP = """
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'kind', ARGV[5], 'id', ARGV[1], 'reason', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""

REASON_CHARS = 1000  # a reason is cut to this length


class DeadLetters:
    """One job's dead-letter stream."""

    def __init__(self, client: RedisClient, keys: JobKeys, *, maxlen: int, ttl_s: float) -> None:
        self.client, self.key, self.maxlen, self.ttl_ms = client, keys.dead_letters, maxlen, int(ttl_s * 1000)
        self._give_up = client.register_script(_GIVE_UP)
        self._drop = client.register_script(_DROP)

    def give_up(self, stream: BoundedStream, entry_id: str, reason: str, *, kind: str) -> bool:
        """Take `entry_id`, pending in `stream`'s group, off the stream into the dead letters with `reason`. False
        when it was no longer pending (acknowledged, or given up on already)."""
        return bool(
            self._give_up(
                keys=[stream.key, stream.freed_key, self.key],
                args=[stream.group, entry_id, reason[:REASON_CHARS], self.maxlen, self.ttl_ms, kind],
            )
        )

    def drop(self, stream_key: str, entry_id: str, reason: str, *, kind: str) -> bool:
        """Delete `entry_id` from a stream read without a consumer group (the gradients) into the dead letters. False
        when it was gone already (applied, or given up on by another reader)."""
        return bool(
            self._drop(
                keys=[stream_key, self.key], args=[entry_id, reason[:REASON_CHARS], self.maxlen, self.ttl_ms, kind]
            )
        )

    def read(self, after: str = "0-0", count: int = 10_000) -> list[tuple[str, dict[str, str]]]:
        """The dead letters after id `after`, oldest first: (id, {kind, id, reason})."""
        items = self.client.xrange(self.key, min=f"({after}" if after != "0-0" else "-", count=count)
        return [(i, {_s(k): _s(v) for k, v in f.items()}) for i, f in stream_entries(items)]


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
