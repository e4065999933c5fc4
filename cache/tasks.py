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
The scripts themselves live in `cache.task_scripts`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from cache import task_scripts as scripts
from cache.deferred import Deferred
from cache.keys import JobKeys
from cache.redis_types import RedisClient, stream_entries
from cache.streams import BoundedStream, Entry, blpop_timeout
from contract.errors import BackpressureTimeout
from contract.records import GradientRecord, LearnerTask


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
            k.tasks, k.learners, k.learner_deadlines, k.dead_letters, k.policy_version, k.aggregator,
            k.tasks_closed, k.tasks_wake, k.control, k.grad,
        ]  # fmt: skip
        args: list[Any] = [
            self.GROUP, learner_id, self.lease_ms, self.max_attempts, self.ttl_ms, self.dead_letter_maxlen, 256,
            "" if held_version is None else str(held_version), k.policy(0)[:-1], self.gradient_maxlen, holding or "",
        ]  # fmt: skip
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
