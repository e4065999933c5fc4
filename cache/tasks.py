"""The learner task board: a round's (epoch, minibatch) tasks on a stream with one consumer group, leased to
learners, each turned into exactly one stored gradient or one dead letter.

Exactly-once rests on three atomic steps (Lua), each one round trip:
- `claim`: drops learners whose lease ran out, takes over the tasks they held (orphans first; a task delivered
  `max_attempts` times goes to the dead-letter stream instead), else reads one new task; registers the caller's
  lease and the policy version it will hold; returns what the learner needs besides the task (current version,
  the versions other learners hold, the aggregator's KL coefficient and target version, how many tasks are
  outstanding, when the next foreign lease expires).
- `complete`: stores the gradient and acknowledges its task together, and only while the caller still owns the
  task: a learner whose task was taken over stores nothing, so a task never yields two gradients.
- `dead_letter`: a task that cannot be decoded or whose trajectory data is gone is acknowledged into the bounded
  dead-letter stream with its reason (and the parameter function is woken, since in-flight work changed).

A task is taken over only when its holder's lease has expired: learners refresh it while they work (`heartbeat`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from cache.errors import BackpressureTimeout
from cache.keys import JobKeys
from cache.records import GradientRecord, LearnerTask
from cache.streams import MAX_BLOCK_S, BoundedStream, Entry

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_WAKE = """
local function wake(key, n, ttl)
  for _ = 1, n do redis.call('LPUSH', key, '1') end
  redis.call('LTRIM', key, 0, 1023)
  redis.call('PEXPIRE', key, ttl)
end
"""

# One round trip per task: store the finished task's gradient with its ack (when one is given), then claim the next.
# KEYS: tasks, learners, deadlines, dead letters, version, aggregator, closed, wake, control, gradients
# ARGV: group, me, lease ms, max attempts, ttl ms, dead-letter maxlen, pending scan count, held version,
#       policy key prefix, gradient maxlen, finished task id ('' for none), then the gradient's fields
_STEP = (
    _NOW
    + _WAKE
    + """
local stored = false
if ARGV[11] ~= '' then
  local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[11], ARGV[11], 1, ARGV[2])
  if #mine == 0 then
    stored = 'lost'
  elseif redis.call('XLEN', KEYS[10]) >= tonumber(ARGV[10]) then
    return {'full'}
  else
    stored = redis.call('XADD', KEYS[10], '*', unpack(ARGV, 12))
    redis.call('PEXPIRE', KEYS[10], ARGV[5])
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[11])
    redis.call('XDEL', KEYS[1], ARGV[11])
    wake(KEYS[8], 1, ARGV[5])
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(dead) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local version = redis.call('GET', KEYS[5])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], version or '0')
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
local claimed = false
local next_expiry = false
local dropped = 0
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[7]))
if not ok then pending = {} end
for _, p in ipairs(pending) do
  local id, owner, deliveries = p[1], p[2], tonumber(p[4])
  if owner == ARGV[2] then
    -- Already ours, yet we ask for work: the reply that carried it was lost (a retry after a dropped connection).
    -- Hand it out again, or it would stay ours, unworked, for as long as our lease lives.
    if not claimed then
      local entries = redis.call('XRANGE', KEYS[1], id, id)
      if #entries > 0 then claimed = entries[1] end
    end
  else
    local deadline = redis.call('ZSCORE', KEYS[3], owner)
    if deadline then
      deadline = tonumber(deadline)
      if not next_expiry or deadline < next_expiry then next_expiry = deadline end
    elseif not claimed then
      local entries = redis.call('XRANGE', KEYS[1], id, id)
      if #entries == 0 or deliveries >= tonumber(ARGV[4]) then
        local reason = 'attempts'
        if #entries == 0 then reason = 'entry gone' end
        redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'kind', 'task', 'id', id, 'reason',
          reason .. ' (' .. deliveries .. ' deliveries, last holder ' .. owner .. ')')
        redis.call('PEXPIRE', KEYS[4], ARGV[5])
        redis.call('XACK', KEYS[1], ARGV[1], id)
        redis.call('XDEL', KEYS[1], id)
        redis.call('XADD', KEYS[9], 'MAXLEN', '~', 64, '*', 'event', 'dead-letter')
        wake(KEYS[8], 1, ARGV[5])
        dropped = dropped + 1
      else
        local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
        if got[1] then claimed = got[1] end
      end
    end
  end
end
if not claimed then
  local ok2, got = pcall(redis.call, 'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
  if ok2 and got then claimed = got[1][2][1] end
end
local weights = false
if claimed and version and version ~= ARGV[8] then
  -- the policy key shares the job's hash tag (same slot) but depends on the version read here
  weights = redis.call('GET', ARGV[9] .. version) or false
end
local outstanding = redis.call('XLEN', KEYS[1])
local agg = redis.call('HMGET', KEYS[6], 'kl_coef', 'target_version')
return {stored, claimed, version or false, outstanding, next_expiry or false, redis.call('HGETALL', KEYS[2]),
        agg[1] or false, agg[2] or false, redis.call('GET', KEYS[7]) or false, dropped, now, weights}
"""
)

# KEYS: tasks, dead letters, wake, control. ARGV: group, me, task id, reason, dead-letter maxlen, ttl ms
_DEAD_LETTER = (
    _WAKE
    + """
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #mine == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'task', 'id', ARGV[3], 'reason', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 64, '*', 'event', 'dead-letter')
wake(KEYS[3], 1, ARGV[6])
return 1
"""
)

# KEYS: deadlines. ARGV: me, lease ms, ttl ms
_HEARTBEAT = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: tasks, wake, closed. ARGV: maxlen, ttl ms, round to close ('' keeps it open), then one header per task
_ENQUEUE = (
    _WAKE
    + """
local room = tonumber(ARGV[1]) - redis.call('XLEN', KEYS[1])
local ids = {}
for i = 4, #ARGV do
  if #ids >= room then break end
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'h', ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if #ids == #ARGV - 3 and ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[2])
end
wake(KEYS[2], math.min(#ids + 1, 64), ARGV[2])
return ids
"""
)


@dataclass(frozen=True)
class Claim:
    """What `claim` returns: the task (None when nothing is claimable now) and the state around it."""

    task: Entry | None
    version: int
    outstanding: int  # tasks enqueued and not yet turned into a gradient or a dead letter
    next_expiry_ms: int | None  # earliest lease deadline among other holders of pending tasks (server clock)
    held: dict[str, int]  # learner id -> policy version, live learners only (the caller included)
    kl_coef: float | None
    target_version: int | None
    closed_round: int  # the newest round whose tasks are all enqueued
    dead_lettered: int  # orphans given up on during this claim
    now_ms: int  # server clock
    weights: bytes | None = None  # the policy at `version`, when a task was claimed and the caller held another
    stored: str | None = None  # the finished task's gradient id; None when none was given or it was lost
    lost: bool = False  # the finished task had been taken over (our lease ran out): its gradient was not stored


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class TaskBoard:
    """One job's learner tasks."""

    GROUP = "learners"

    def __init__(
        self,
        client: redis.Redis,
        keys: JobKeys,
        *,
        maxlen: int,
        ttl_s: float,
        lease_s: float,
        max_attempts: int,
        dead_letter_maxlen: int,
        gradient_maxlen: int,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"learner lease_s must be positive, got {lease_s}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.client = client
        self.keys = keys
        self.stream = BoundedStream(client, keys.tasks, group=self.GROUP, maxlen=maxlen, ttl_s=ttl_s)
        self.ttl_ms = int(ttl_s * 1000)
        self.lease_ms = int(lease_s * 1000)
        self.max_attempts = max_attempts
        self.dead_letter_maxlen = dead_letter_maxlen
        self.gradient_maxlen = gradient_maxlen
        self._step = client.register_script(_STEP)
        self._dead_letter = client.register_script(_DEAD_LETTER)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._enqueue = client.register_script(_ENQUEUE)

    # -- the control plane's side -----------------------------------------------------------------------------
    def enqueue(self, tasks: Sequence[LearnerTask], *, close_round: int | None, timeout_s: float) -> list[str]:
        """Append tasks (waiting for room up to `timeout_s`); with `close_round`, mark that round's tasks all
        enqueued once the last is in. Wakes idle learners. Returns the task ids."""
        self.stream.ensure_group()
        headers = [bytes(t.fields()[1]) for t in tasks]
        ids: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            rest = headers[len(ids) :]
            close = "" if close_round is None else str(close_round)
            got = self._enqueue(
                keys=[self.keys.tasks, self.keys.tasks_wake, self.keys.tasks_closed],
                args=[self.stream.maxlen, self.ttl_ms, close, *rest],
            )
            ids += [_s(i) for i in got]
            if len(ids) == len(headers):
                return ids
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackpressureTimeout(
                    f"task stream {self.keys.tasks} stayed full ({self.stream.maxlen} tasks) for {timeout_s:.1f} s"
                )
            self.client.blpop([self.keys.tasks_wake], timeout=min(remaining, MAX_BLOCK_S))

    def close(self, round_k: int) -> None:
        """Mark round `round_k` fully enqueued (learners of that round leave once nothing is outstanding)."""
        self.enqueue([], close_round=round_k, timeout_s=0.0)

    def outstanding(self) -> int:
        """Tasks not yet turned into a gradient or a dead letter (acknowledged tasks are deleted)."""
        return int(self.client.xlen(self.keys.tasks))

    # -- the learner's side -----------------------------------------------------------------------------------
    def claim(
        self,
        learner_id: str,
        *,
        held_version: int | None = None,
        finished: tuple[str, GradientRecord] | None = None,
        timeout_s: float = 120.0,
    ) -> Claim:
        """Store `finished` (task id, gradient) with its task's ack if the task is still ours, then claim the next
        task: one round trip. Weights of the current version come back with a task unless it is `held_version`.
        A full gradient stream makes this wait for room (the task stays ours meanwhile), up to `timeout_s`."""
        self.stream.ensure_group()
        k = self.keys
        keys = [
            k.tasks, k.learners, k.learner_deadlines, k.dead_letters, k.policy_version, k.aggregator,
            k.tasks_closed, k.tasks_wake, k.control, k.grad,
        ]  # fmt: skip
        args: list[Any] = [
            self.GROUP, learner_id, self.lease_ms, self.max_attempts, self.ttl_ms, self.dead_letter_maxlen, 256,
            "" if held_version is None else str(held_version), k.policy(0)[:-1], self.gradient_maxlen,
        ]  # fmt: skip
        args += [finished[0], *finished[1].fields()] if finished else [""]
        deadline = time.monotonic() + timeout_s
        while True:
            raw = self._step(keys=keys, args=args)
            if raw[0] != b"full":
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackpressureTimeout(
                    f"gradient stream {k.grad} stayed full ({self.gradient_maxlen}) for {timeout_s:.1f} s"
                )
            self.client.blpop([k.freed(k.grad)], timeout=min(remaining, MAX_BLOCK_S))
        stored, entry, version, outstanding, expiry, held, kl, target, closed, dropped, now, weights = raw
        task = None
        if entry:
            flat = entry[1] or []
            task = Entry(_s(entry[0]), {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)})
        return Claim(
            task=task,
            version=int(version or 0),
            outstanding=int(outstanding),
            next_expiry_ms=int(expiry) if expiry else None,
            held={_s(held[i]): int(held[i + 1]) for i in range(0, len(held), 2)},
            kl_coef=float(kl) if kl else None,
            target_version=int(float(target)) if target else None,
            closed_round=int(closed) if closed else 0,
            dead_lettered=int(dropped),
            now_ms=int(now),
            weights=bytes(weights) if weights else None,
            stored=None if not stored or stored == b"lost" else _s(stored),
            lost=stored == b"lost",
        )

    def dead_letter(self, learner_id: str, task_id: str, reason: str) -> bool:
        k = self.keys
        return bool(
            self._dead_letter(
                keys=[k.tasks, k.dead_letters, k.tasks_wake, k.control],
                args=[self.GROUP, learner_id, task_id, reason[:1000], self.dead_letter_maxlen, self.ttl_ms],
            )
        )

    def heartbeat(self, learner_id: str) -> None:
        self._heartbeat(keys=[self.keys.learner_deadlines], args=[learner_id, self.lease_ms, self.ttl_ms])

    def leave(self, learner_id: str) -> None:
        """Deregister (others no longer truncate against our policy) and pass a wake-up on to the next idle
        learner, so that every waiter sees a finished round, not just the one the last task woke."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.learners, learner_id)
            pipe.zrem(self.keys.learner_deadlines, learner_id)
            pipe.lpush(self.keys.tasks_wake, "1")
            pipe.ltrim(self.keys.tasks_wake, 0, 1023)
            pipe.pexpire(self.keys.tasks_wake, self.ttl_ms)
            pipe.execute()

    def wait(self, timeout_s: float) -> None:
        """Block until tasks are enqueued or finished (or `timeout_s`, which callers bound by a lease expiry)."""
        if timeout_s > 0:
            self.client.blpop([self.keys.tasks_wake], timeout=min(max(timeout_s, 0.01), MAX_BLOCK_S))

    @contextlib.contextmanager
    def leased(self, learner_id: str) -> Iterator[None]:
        """Keep `learner_id`'s lease fresh from a background thread (a third of the lease apart) until the block
        ends; then leave. A killed process stops refreshing, so its lease runs out and its task is taken over."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.lease_ms / 3000):
                with contextlib.suppress(redis.RedisError):
                    self.heartbeat(learner_id)

        thread = threading.Thread(target=beat, name=f"lease-{learner_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(redis.RedisError):
                self.leave(learner_id)

    def read_dead_letters(self, after: str = "0-0", count: int = 10_000) -> list[tuple[str, dict[str, str]]]:
        items = self.client.xrange(self.keys.dead_letters, min=f"({after}" if after != "0-0" else "-", count=count)
        return [(_s(i), {_s(k): _s(v) for k, v in f.items()}) for i, f in items]
