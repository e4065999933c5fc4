"""The scale model's event core (docs/scale-model.md): one round's learner tasks on N learners, on a virtual clock.

The round protocol's tasks (docs/algorithms.md) wait in a FIFO queue, a step at a time (a sync step is one task per
learner; the next is enqueued once the step's update is out). A learner that is ready claims the next task, holding
the newest version published at that moment; when it claims ahead (every rule but sync), it also claims its next task
as it starts computing, as `functions/learner/claim_ahead.py` does. Its gradient is computed right then
(`Work.compute`: the caller's, for real) and lands at start + its modelled seconds (`stretch`). The parameter function
is one server: on every landing, when idle, it asks the rule (`Work.decide`, with the base versions of the tasks still
in flight), applies for the seconds the caller measured, and publishes a new version; gradients landing meanwhile
queue. Causality holds because a gradient depends only on what was published before it started.

Events at the same virtual time go in a fixed order: publishes, landings, decisions, claims (a learner freed by a
landing claims after a publish its landing caused, when the apply took no time), each kind in the order it was
scheduled. Pure: no clock is read, nothing is drawn here.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Event kinds, in their order at equal times.
PUBLISH, LAND, DECIDE, CLAIM = range(4)


@dataclass(frozen=True)
class Start:
    """A learner starts computing task `task` (its index in the round's order) at `time`, on version `version`;
    `others`: the distinct other versions that learners with work in hand hold (truncation, paper Eq. 2); `first`:
    the learner's first task of the round (it prepares the round's data)."""

    task: int
    learner: int
    time: float
    version: int
    others: tuple[int, ...]
    first: bool


@dataclass(frozen=True)
class Landing:
    """Task `task`'s gradient, computed by `learner` from `start` on `version`, lands at `end`; `measured_s`: the
    compute time this machine measured for it."""

    task: int
    learner: int
    start: float
    end: float
    version: int
    measured_s: float


@dataclass(frozen=True)
class Published:
    """Version `version` published at `time`, decided at `decided_at`."""

    version: int
    time: float
    decided_at: float


class Work(Protocol):
    """What the caller does at each event: compute a task's gradient (returns its measured seconds), queue a landed
    one, decide and apply (returns the apply's seconds, or None when the rule applies nothing), say how many landed
    gradients are still queued."""

    def compute(self, start: Start) -> float: ...

    def land(self, landing: Landing) -> None: ...

    def decide(self, version: int, in_flight: tuple[int, ...]) -> float | None: ...

    def queued(self) -> int: ...


@dataclass
class RoundTrace:
    """What happened in one round: each start, landing and publish in order, when each learner was ready, and the
    round's end (its last publish, or its last landing if later)."""

    ready: tuple[float, ...]
    starts: list[Start] = field(default_factory=list)
    landings: list[Landing] = field(default_factory=list)
    published: list[Published] = field(default_factory=list)

    @property
    def last_landing(self) -> float:
        return max((landing.end for landing in self.landings), default=0.0)

    @property
    def end(self) -> float:
        return max([self.last_landing, *(p.time for p in self.published), *self.ready])


@dataclass
class _Learner:
    running: int | None = None  # the task it computes
    ahead: tuple[int, int] | None = None  # (task, version) claimed ahead
    holds: int | None = None  # the version of its newest claim, while it has work in hand (the learner registry's)
    ready: bool = False
    started: bool = False


class _Round:
    def __init__(
        self,
        work: Work,
        steps: Sequence[int],
        ready: Sequence[float],
        stretch: Callable[[int, float], float],
        *,
        version: int,
        claim_ahead: bool,
        enqueued_at: float,
    ) -> None:
        self.work, self.stretch, self.version, self.claim_ahead = work, stretch, version, claim_ahead
        self.trace = RoundTrace(tuple(ready))
        self.heap: list[tuple[float, int, int, int]] = []  # (time, kind, order, learner or -1)
        self.order = itertools.count()
        self.steps = deque(steps)
        self.fifo: deque[int] = deque()
        self.tasks = itertools.count()
        self.base: dict[int, int] = {}  # claimed task -> the version it is computed on
        self.unfinished: set[int] = set()  # enqueued tasks whose gradient has not landed
        self.running: dict[int, tuple[Start, float]] = {}  # task -> its start and measured seconds
        self.busy = self.deciding = False  # the parameter function applies; a decision is scheduled
        self.decided_at = 0.0  # when the apply in progress was decided
        self.learners = [_Learner() for _ in ready]
        self._enqueue_step(enqueued_at)
        for i, t in enumerate(ready):
            self._push(t, CLAIM, i)

    def _push(self, time: float, kind: int, learner: int = -1) -> None:
        heapq.heappush(self.heap, (time, kind, next(self.order), learner))

    def run(self) -> RoundTrace:
        handlers = {PUBLISH: self._publish, LAND: self._land, DECIDE: self._decide, CLAIM: self._claim}
        while self.heap:
            time, kind, _, learner = heapq.heappop(self.heap)
            handlers[kind](time, learner)
        if self.unfinished or self.steps or self.work.queued():
            raise RuntimeError(
                f"the round stopped with {len(self.unfinished)} task(s) unfinished, {len(self.steps)} step(s) not "
                f"enqueued and {self.work.queued()} gradient(s) queued: the rule deferred with nothing in flight"
            )
        return self.trace

    def _enqueue_step(self, time: float) -> None:
        tasks = [next(self.tasks) for _ in range(self.steps.popleft())]
        self.fifo.extend(tasks)
        self.unfinished.update(tasks)
        for i, learner in enumerate(self.learners):
            if learner.ready and learner.running is None:  # idle: it claims now (one not yet ready claims when it is)
                self._push(time, CLAIM, i)

    def _take(self) -> tuple[int, int] | None:
        """The next task in the queue, claimed now: on the newest version."""
        if not self.fifo:
            return None
        task = self.fifo.popleft()
        self.base[task] = self.version
        return task, self.version

    def _claim(self, time: float, index: int) -> None:
        learner = self.learners[index]
        learner.ready = True
        if learner.running is not None:
            return
        taken = learner.ahead or self._take()
        learner.ahead = None
        if taken is None:
            learner.holds = None  # nothing in hand: it truncates no one's gradient
            return
        task, version = taken
        others = {o.holds for o in self.learners if o is not learner and o.holds is not None} - {version}
        start = Start(task, index, time, version, tuple(sorted(others)), first=not learner.started)
        learner.running, learner.started, learner.holds = task, True, version
        if self.claim_ahead and (ahead := self._take()) is not None:
            learner.ahead, learner.holds = ahead, ahead[1]
        self.trace.starts.append(start)
        measured = self.work.compute(start)
        self.running[task] = (start, measured)
        self._push(time + self.stretch(index, measured), LAND, index)

    def _land(self, time: float, index: int) -> None:
        learner = self.learners[index]
        task = learner.running
        assert task is not None
        start, measured = self.running.pop(task)
        landing = Landing(task, index, start.time, time, start.version, measured)
        learner.running = None
        if learner.ahead is None:
            learner.holds = None
        self.unfinished.discard(task)
        self.base.pop(task, None)
        self.trace.landings.append(landing)
        self.work.land(landing)
        self._poke(time)
        self._push(time, CLAIM, index)

    def _poke(self, time: float) -> None:
        """Schedule a decision now, unless the parameter function is applying or one is scheduled already."""
        if not self.busy and not self.deciding and self.work.queued():
            self.deciding = True
            self._push(time, DECIDE)

    def _decide(self, time: float, index: int) -> None:
        self.deciding = False
        if self.busy:
            return
        in_flight = tuple(self.base.get(task, self.version) for task in sorted(self.unfinished))
        apply_s = self.work.decide(self.version, in_flight)
        if apply_s is None:
            self._next_step(time)
            return
        self.busy, self.decided_at = True, time
        self._push(time + apply_s, PUBLISH)

    def _publish(self, time: float, index: int) -> None:
        self.version += 1
        self.busy = False
        self.trace.published.append(Published(self.version, time, self.decided_at))
        self._poke(time)
        self._next_step(time)

    def _next_step(self, time: float) -> None:
        """Enqueue the next step once the last one is done: every task landed, nothing queued or being applied."""
        if self.steps and not self.unfinished and not self.busy and not self.work.queued():
            self._enqueue_step(time)


def run_round(
    work: Work,
    *,
    steps: Sequence[int],
    ready: Sequence[float],
    stretch: Callable[[int, float], float],
    version: int,
    claim_ahead: bool,
    enqueued_at: float = 0.0,
) -> RoundTrace:
    """Run one round: `steps` (task counts, enqueued one after another; one step holds the whole round but under
    sync) on learners ready at `ready` (one time each), from published version `version`; the first step is enqueued
    at `enqueued_at`. `stretch(learner, measured_s)` gives a task's modelled seconds (`latency.ClusterLatency`)."""
    if not ready:
        raise ValueError("a round needs at least one learner")
    if not steps or any(n < 1 for n in steps):
        raise ValueError(f"steps must be positive task counts, got {list(steps)}")
    return _Round(work, steps, ready, stretch, version=version, claim_ahead=claim_ahead, enqueued_at=enqueued_at).run()
