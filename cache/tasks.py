"""A round's learner tasks and the gradients they become: the job's task board and its gradient stream.

The task board: a round's (epoch, minibatch) tasks on a stream with one consumer group, leased to learners, each turned
into exactly one stored gradient or one dead letter. Exactly-once rests on three atomic steps (Lua, in
`cache.task_scripts`), each one round trip:
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

The gradient stream (`GradientStream`): actors that compute gradients themselves (the ``gradients_at_actors``
profile) push theirs onto it (`ActorGradients`), made idempotent another way: the script records each actor's last
stored task id and stores nothing when the same id comes again (a push whose reply was lost and that the client ran
again, cache/retry.py); a full stream makes the writer wait for room. The parameter function is its only reader (it
holds the update lease), so it keeps its own place, without a consumer group (`GradientFeed`): every gradient is read
once, when it lands, and leaves the stream only with the publish of the version it went into
(`PolicyStore.publish_and_ack`). Only its header is decoded on the read (`GradientStream.meta`); one that cannot be,
or that names a base version never published, is poison, returned apart for the reader to `drop` into the dead
letters. A blocking read waits on the control stream too, so a stop event (`JobCache.stop_round`) ends a wait as a
gradient's landing does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from cache import task_scripts as scripts
from cache.dead_letters import DeadLetters
from cache.deferred import Deferred
from cache.keys import JobKeys
from cache.redis_types import RedisClient, read_entries, stream_entries, text
from cache.streams import MAX_BLOCK_S, BoundedStream, Entry, blpop_timeout
from contract.batch_checks import version_ahead
from contract.errors import BackpressureTimeout, CodecError, FencingError, RecordError
from contract.records import GradientMeta, GradientRecord, LearnerTask


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


def _claim_of(raw: list[Any]) -> Claim:
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


class PendingClaim:
    """A claim sent and not yet read (`TaskBoard.send_claim`). A full gradient stream, which the claim's reply
    reports without storing or claiming anything, is waited out by `result`, up to the claim's `timeout_s`."""

    def __init__(self, board: TaskBoard, keys: list[str], args: list[Any], timeout_s: float, *, now: bool) -> None:
        self._board, self._keys, self._args = board, keys, args
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._call = None if now else Deferred(board.client, board._step, keys, args)
        self._claim: Claim | None = None

    def result(self) -> Claim:
        if self._claim is not None:
            return self._claim
        board, k = self._board, self._board.keys
        raw = self._call.result() if self._call is not None else board._step(keys=self._keys, args=self._args)
        while raw[0] == b"full":
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise BackpressureTimeout(
                    f"gradient stream {k.grad} stayed full ({board.gradient_maxlen}) for {self._timeout_s:.1f} s"
                )
            board.client.blpop([k.freed(k.grad)], timeout=blpop_timeout(remaining))
            raw = board._step(keys=self._keys, args=self._args)
        self._claim = _claim_of(raw)
        return self._claim


class TaskBoard:
    """One job's learner tasks."""

    GROUP = "learners"

    def __init__(
        self,
        client: RedisClient,
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
        self._step = client.register_script(scripts.STEP)
        self._dead_letter = client.register_script(scripts.DEAD_LETTER)
        self._heartbeat = client.register_script(scripts.HEARTBEAT)
        self._enqueue = client.register_script(scripts.ENQUEUE)

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
            self.client.blpop([self.keys.tasks_wake], timeout=blpop_timeout(remaining))

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
        holding: str | None = None,
        timeout_s: float = 120.0,
    ) -> Claim:
        """Store `finished` (task id, gradient) with its task's ack if the task is still ours, then claim the next
        task: one round trip. Weights of the current version come back with a task unless it is `held_version`.
        `holding`: a task of ours that we compute meanwhile (a learner claiming ahead), never handed back to us.
        A full gradient stream makes this wait for room (the task stays ours meanwhile), up to `timeout_s`."""
        return self.send_claim(
            learner_id, held_version=held_version, finished=finished, holding=holding, timeout_s=timeout_s, now=True
        ).result()

    def send_claim(
        self,
        learner_id: str,
        *,
        held_version: int | None = None,
        finished: tuple[str, GradientRecord] | None = None,
        holding: str | None = None,
        timeout_s: float = 120.0,
        now: bool = False,
    ) -> PendingClaim:
        """`claim`, sent now and read by the returned claim's `result()` (`cache.deferred`): a learner claiming
        ahead computes its task meanwhile. `now`: made on the client's ordinary path at once instead."""
        self.stream.ensure_group()
        k = self.keys
        keys = [
            k.tasks,
            k.learners,
            k.learner_deadlines,
            k.dead_letters,
            k.policy_version,
            k.aggregator,
            k.tasks_closed,
            k.tasks_wake,
            k.control,
            k.grad,
        ]
        args: list[Any] = [
            self.GROUP,
            learner_id,
            self.lease_ms,
            self.max_attempts,
            self.ttl_ms,
            self.dead_letter_maxlen,
            256,
            "" if held_version is None else str(held_version),
            k.policy(0)[:-1],
            self.gradient_maxlen,
            holding or "",
        ]
        args += [finished[0], *finished[1].fields()] if finished else [""]
        return PendingClaim(self, keys, args, timeout_s, now=now)

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

    def evict(self, learner_id: str) -> None:
        """`learner_id` is known to be gone (the platform killed its instance): drop its lease now, so that its task
        is taken over at once (idle learners are woken) rather than when the lease runs out. Were the holder still
        alive, it would only lose the task: its gradient would not be stored."""
        self.leave(learner_id)

    def wait(self, timeout_s: float) -> None:
        """Block until tasks are enqueued or finished (or `timeout_s`, which callers bound by a lease expiry)."""
        if timeout_s > 0:
            self.client.blpop([self.keys.tasks_wake], timeout=blpop_timeout(timeout_s))

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
        return [(i, {_s(k): _s(v) for k, v in f.items()}) for i, f in stream_entries(items)]


READ_COUNT = 256  # the most gradients one read returns


# --- the gradient stream ---------------------------------------------------------------------------------------------


class GradientStream:
    """Gradients waiting for the parameter function, in arrival order. It is their only reader (it holds the
    update lease), so the stream needs no consumer group: entries are deleted in the same atomic step that
    publishes the version they went into (`PolicyStore.publish_and_ack`)."""

    def __init__(
        self, client: RedisClient, key: str, *, payload_bytes_max: int, version_key: str | None = None
    ) -> None:
        self.client = client
        self.key = key
        self.payload_bytes_max = payload_bytes_max
        self.version_key = version_key  # the job's newest published policy version

    def read(self, after: str = "0-0", *, count: int = 1024, block_s: float = 0.0) -> list[Entry]:
        """Entries newer than `after`, blocking up to `block_s` when there are none."""
        block_ms = int(min(block_s, MAX_BLOCK_S) * 1000)
        reply = self.client.xread({self.key: after}, count=count, block=block_ms or None)
        return [Entry(i, f) for i, f in read_entries(reply)]

    def meta(self, entry: Entry, *, held: int | None = None) -> GradientMeta:
        """The entry's header. With `held`, the version its reader (the update lease's holder) last published: a base
        version past it that the store never published either is `RecordError` (poison: no learner can have held
        it), and a store that has moved past `held` is `FencingError` (another holder published)."""
        meta = GradientMeta.from_fields(entry.fields)
        if held is None or version_ahead(meta.base_version, held, "") is None or self.version_key is None:
            return meta
        published = int(self.client.get(self.version_key) or 0)
        if published > held:
            raise FencingError(f"policy version {published} was published by another holder; the reader holds {held}")
        raise RecordError(str(version_ahead(meta.base_version, published, f"gradient {meta.task_id!r}: base version")))

    def record(self, entry: Entry) -> GradientRecord:
        return GradientRecord.from_fields(entry.fields, max_bytes=self.payload_bytes_max)

    def length(self) -> int:
        return int(self.client.xlen(self.key))

    def put(self, record: GradientRecord) -> str:
        """Append outside the task protocol (tests, tools); learners use `TaskBoard.complete`."""
        return text(self.client.xadd(self.key, dict(_pairs(record.fields()))))


def _pairs(flat: Sequence[bytes | memoryview]) -> list[tuple[bytes, bytes | memoryview]]:
    return [(bytes(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


class _JobGradients(Protocol):
    """What a feed reads through: a job's client, keys, gradient stream and dead letters (`cache.job.JobCache`)."""

    client: RedisClient
    keys: JobKeys
    gradients: GradientStream
    dead_letters: DeadLetters


# the most gradients one read returns


@dataclass(frozen=True)
class Landed:
    """What one read brought: the gradients by header, with their entries (their arrays are decoded only when they
    are aggregated), and the poisoned ones by id, with the reason."""

    gradients: list[tuple[Entry, GradientMeta]]
    poisoned: list[tuple[str, str]]


class GradientFeed:
    """One reader's place in a job's gradient and control streams. Control events sent before it was made are not
    its own: it reads those sent after. `stopped`: it read a stop event."""

    def __init__(self, job: _JobGradients, *, count: int = READ_COUNT) -> None:
        self.client, self.keys, self.count = job.client, job.keys, count
        self.gradients, self.dead_letters = job.gradients, job.dead_letters
        self.after = "0-0"  # the last gradient read
        last: Any = self.client.xrevrange(self.keys.control, count=1)
        self.control_after = _id(last[0][0]) if last else "0-0"
        self.stopped = False

    def take(self, entries: Iterable[Entry], *, held: int) -> Landed:
        """Entries read elsewhere (a publish returns those that landed meanwhile), the reader's place moved past them.
        `held`: the version the reader last published; a gradient based on a newer one that the store never published
        is poison, and a store moved past `held` raises `FencingError` (another holder published)."""
        gradients: list[tuple[Entry, GradientMeta]] = []
        poisoned: list[tuple[str, str]] = []
        for e in entries:
            self.after = e.id
            try:
                gradients.append((e, self.gradients.meta(e, held=held)))
            except (CodecError, RecordError) as exc:
                poisoned.append((e.id, f"{type(exc).__name__}: {exc}"))
        return Landed(gradients, poisoned)

    def read(self, *, held: int, count: int | None = None) -> Landed:
        """The gradients landed since the last read, at most `count` (the reader's own by default), without waiting."""
        return self.take(self.gradients.read(self.after, count=count or self.count), held=held)

    def wait(self, block_s: float, *, held: int) -> Landed:
        """The gradients landed since the last read, waiting up to `block_s` (1 ms at least) for one to land or for a
        control event (a stop sets `stopped`)."""
        streams: dict[Any, Any] = {self.keys.grad: self.after, self.keys.control: self.control_after}
        reply: Any = self.client.xread(streams, count=self.count, block=max(1, int(block_s * 1000)))
        entries: list[Entry] = []
        for stream, items in reply or []:
            if _id(stream) == self.keys.grad:
                entries = [Entry(_id(i), f) for i, f in items if f]
            else:
                self.control_after = _id(items[-1][0])
                self.stopped |= any(f.get(b"event") == b"stop" for _, f in items)
        return self.take(entries, held=held)

    def drop(self, gradient_id: str, reason: str) -> bool:
        """Take a poisoned gradient off the stream into the dead letters, with `reason`; False when it was gone."""
        return self.dead_letters.drop(self.keys.grad, gradient_id, reason, kind="gradient")


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


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
