"""The round protocol (docs/algorithms.md), written once: a round's learner tasks on the task board, `learners` learner
invocations working through them while one parameter invocation applies their gradients as they land, failed
invocations replaced; serverless actor invocations on a pool of their own.

Parameterised by how functions are invoked (`Functions`): through the gateway in the product
(`stellaris.platform.deployment.GatewayFunctions`), in-process in the tests' driver. Handler results are read only
through the records of `contract`. Event-driven: invocations are futures, a sync step's end is awaited on
published versions; nothing polls.

The learner gate (`LearnerGate`, below the calls; docs/workflows.md) starts each round: a round's learners are invoked
when the job's learner trigger fires over the batches landed in the cache. The gate claims landed batches atomically
(`cache.trajectories`: a batch goes to exactly one firing), reads only their headers, and fires once every condition of
the trigger holds; the firing's batches are the round's. A claimed batch that cannot be trained on (an undecodable
header, a version never published, a header without its arrays) is dead-lettered by the claim and the gate claims on: it
costs the round nothing but itself. Round 1 is every actor's first batch, in actor order, as before triggers, whatever
the trigger says (docs/training.md); batches landed beyond that are carried, already claimed, into round 2.

Event-driven: a claim blocks on the stream until a batch lands; conditions that no landing changes (a period, a
predicate, a version) are looked at again at least every `ACTOR_CHECK_S`. Dead serverful actors are looked for (a
non-blocking wait on each process) before every claim: at once when collection starts, and at least every
`ACTOR_CHECK_S` while it waits; hung ones (a heartbeat that stands still) too, once it has waited that long.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import redis

from cache import JobCache, LearnerTask
from cache.trajectories import BatchClaims
from contract import ActorResult, LearnerResult, ParameterResult
from contract.knobs import Rule
from stellaris.platform.cache_faults import refused_for_memory
from stellaris.platform.calls import TrainingError
from stellaris.platform.serverful_actors import ServerfulActors
from stellaris.round.batches import Landed, actors_in, first_of_each
from stellaris.round.stats import Call, Role, RoundStats
from stellaris.round.triggers import LandedFacts, LearnerTrigger

__all__ = [
    "Call",
    "Functions",
    "Intake",
    "LearnerGate",
    "Role",
    "RoundStats",
    "Rounds",
    "TrainingError",
    "round_steps",
    "round_tasks",
]

MAX_RESTARTS = 64  # replacements of failed invocations (or dead actors) per round before the job gives up
DRAIN_CHECK_S = 1.0  # while a sync step drains, how often finished invocations are looked at between versions
LEARN_THREADS, ACT_THREADS = "learn", "act"  # the call pools' thread names (ThreadPoolExecutor adds "_<n>")
CALL_THREADS = (f"{LEARN_THREADS}_", f"{ACT_THREADS}_")


class Functions(Protocol):
    """How the round's functions are invoked: `invoke` runs one call to completion; `died` says whether an exception
    it raised means the instance died or timed out (the call is then replaced) rather than a bug (raised); `gone`,
    whether the platform also made sure that instance is gone (killed it), so what it held is free at once."""

    def invoke(self, role: Role, event: dict[str, Any]) -> Call: ...

    def died(self, exc: BaseException) -> bool: ...

    def gone(self, exc: BaseException) -> bool: ...


def round_tasks(round_k: int, batch_ids: Sequence[str], *, epochs: int, minibatches: int) -> list[LearnerTask]:
    """One task per (epoch, minibatch) of the round's batches (docs/algorithms.md): one gradient each."""
    ids = tuple(batch_ids)
    return [LearnerTask(round_k, ids, e, i, minibatches) for e in range(epochs) for i in range(minibatches)]


def round_steps(tasks: list[LearnerTask], *, mode: Rule, learners: int) -> list[list[LearnerTask]]:
    """A synchronous step is one task per learner, all on the same version, averaged into one update; the next
    step's tasks are enqueued once that version is out (docs/algorithms.md `sync` baseline). Otherwise the whole round
    is
    one step."""
    size = learners if mode == "sync" else len(tasks)
    return [tasks[lo : lo + size] for lo in range(0, len(tasks), max(size, 1))]


def succeeded(call: Call, role: Role) -> bool:
    """A call that ended without doing its work (a learner timed out; a parameter call found the update lease held,
    was fenced or expired) is replaced like one whose instance died."""
    if role == "learner":
        return LearnerResult.from_dict(call.result).status == "done"
    if role == "parameter":
        return ParameterResult.from_dict(call.result).status == "ok"
    return True


class _RoundCalls:
    """One round's invocations: `invocations` learner invocations working through the round's tasks and one
    parameter invocation applying gradients as they land. An invocation whose instance died is replaced (the
    replacement takes over the dead one's task; a parameter replacement resumes from the cache). Each invocation
    gets its own holder id (its learner lease, or the update lease's owner), so that what a dead one held is freed
    as soon as the platform says its instance is gone, not when the lease runs out.

    A replacement learner often waits for a cold start while the survivors finish the round's tasks. Once the
    parameter invocation is done (every task applied or dead-lettered), the round waits neither for such
    replacements nor for adopted ones still starting: they are carried into the next round, which adopts them as
    learners of its own."""

    def __init__(self, rounds: Rounds, round_k: int, stats: RoundStats) -> None:
        self.r, self.round_k, self.stats = rounds, round_k, stats
        self.learners: set[Future[Call]] = set()
        self.parameter: Future[Call] | None = None
        self.holders: dict[Future[Call], str] = {}
        self.replacements: set[Future[Call]] = set()  # learners started in place of failed ones
        self.adopted: set[Future[Call]] = set()  # learners carried over from the previous round
        self.closed = False  # the round's last step is enqueued
        self.last_failure: BaseException | None = None  # named when the job gives up (e.g. no node can place it)
        self.failed_calls = 0  # replaced this round; past MAX_RESTARTS the job gives up

    def start(self) -> None:
        self.holders |= self.r.carried
        self.adopted, self.r.carried = set(self.r.carried), {}
        self.learners |= self.adopted
        for _ in range(self.r.invocations - len(self.adopted)):
            self._learner()
        self._parameter()
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self.learners))

    def _submit(self, role: Role) -> Future[Call]:
        holder = f"{role}-{self.r.holder_prefix}-{self.round_k}.{next(self.r.serial)}"
        key = "learner_id" if role == "learner" else "owner"
        event = {"job": self.r.job.keys.job, "round": self.round_k, key: holder}
        fut = self.r.pool.submit(self.r.functions.invoke, role, event)
        self.holders[fut] = holder
        return fut

    def _learner(self) -> Future[Call]:
        fut = self._submit("learner")
        self.learners.add(fut)
        return fut

    def _parameter(self) -> None:
        self.parameter = self._submit("parameter")

    def _failed(self, fut: Future[Call], role: Role) -> bool:
        """True when the call failed because its instance died or timed out (replace it); raises otherwise."""
        exc, holder = fut.exception(), self.holders.pop(fut, None)
        if exc is None:
            return not succeeded(fut.result(), role)
        if self.r.functions.died(exc):
            if refused_for_memory(exc):  # Redis is out of memory: a replacement would fail the same way
                raise exc
            self.last_failure = exc
            if holder is not None and self.r.functions.gone(exc):
                with contextlib.suppress(redis.RedisError):  # then its lease runs out, as it would without this
                    if role == "learner":
                        self.r.job.board.evict(holder)
                    else:
                        self.r.job.policies.evict(holder)
            return True
        raise exc

    def _reap(self) -> None:
        for fut in [f for f in self.learners if f.done()]:
            self.learners.discard(fut)
            if self._failed(fut, "learner"):
                self.stats.learner_restarts += 1
                self.failed_calls += 1
                self.replacements.add(self._learner())
                continue
            self.stats.add(fut.result(), "learner")
            # An adopted learner leaves when its own (previous) round is done, possibly before this round's tasks
            # were enqueued or while a sync round is between steps: one of this round's takes its place.
            if fut in self.adopted and not (self.closed and self.r.job.board.outstanding() == 0):
                self._learner()
        if self.parameter is not None and self.parameter.done():
            fut, self.parameter = self.parameter, None
            if self._failed(fut, "parameter"):
                self.stats.parameter_restarts += 1
                self.failed_calls += 1
                self._parameter()
            else:
                self.stats.add(fut.result(), "parameter")
        if self.failed_calls > MAX_RESTARTS:
            raise TrainingError(
                f"more than {MAX_RESTARTS} function invocations failed in round {self.round_k}; the last: "
                f"{self.last_failure}"
            )

    def supervise(self, *, until_drained: bool) -> None:
        """Until every invocation has finished (the round is accounted for: each task applied or dead-lettered),
        or with `until_drained` until nothing is outstanding or queued (a sync step's update is out)."""
        job = self.r.job
        while True:
            self._reap()
            if until_drained:
                if job.board.outstanding() == 0 and job.gradients.length() == 0:
                    return
                job.policies.wait_for_version(job.policies.version() or 0, timeout_s=DRAIN_CHECK_S)
                continue
            calls = self.learners | ({self.parameter} if self.parameter else set())
            if not calls:
                return
            if self.parameter is None and self.learners <= self.replacements | self.adopted:
                # The parameter invocation is done, so is the round's work: carry replacements still starting.
                self.r.carried = {fut: self.holders.pop(fut) for fut in self.learners}
                return
            wait(calls, return_when=FIRST_COMPLETED)


class Rounds:
    """The protocol for one job. `learners` is the learner capacity (a sync step's size); `invocations` how many
    learner invocations each round starts (default `learners`; 0 where learners are started elsewhere, as the tests'
    worker processes are). Learner and parameter calls run on one pool, serverless actor calls on another, each as
    large as its role's capacity, so neither caps the other."""

    def __init__(
        self,
        job: JobCache,
        functions: Functions,
        *,
        mode: Rule,
        learners: int,
        actors: int,
        invocations: int | None = None,
        enqueue_timeout_s: float | None = None,
    ) -> None:
        self.job, self.functions, self.mode, self.learners = job, functions, mode, learners
        self.invocations = learners if invocations is None else invocations
        self.enqueue_timeout_s = job.limits.backpressure_timeout_s if enqueue_timeout_s is None else enqueue_timeout_s
        self.pool = self._learner_pool()
        self.actor_pool = ThreadPoolExecutor(max_workers=max(1, actors), thread_name_prefix=ACT_THREADS)
        # Invocations' holder ids: unique in the job, also across a resume by another control plane.
        self.holder_prefix, self.serial = uuid.uuid4().hex[:8], itertools.count(1)
        # Replacement learners still running when their round was done, with their holder ids: the next round's.
        self.carried: dict[Future[Call], str] = {}

    def begin(self, round_k: int, stats: RoundStats) -> None:
        """Before the round's batches are collected (a profile may start invocations here; this one starts none)."""

    def learn(self, round_k: int, tasks: list[LearnerTask], stats: RoundStats) -> None:
        """Enqueue the round's tasks step by step (the last step closes the round) and supervise the invocations
        until every task is applied or dead-lettered."""
        steps = round_steps(tasks, mode=self.mode, learners=self.learners)
        calls = _RoundCalls(self, round_k, stats)
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            self.job.board.enqueue(step, close_round=round_k if last else None, timeout_s=self.enqueue_timeout_s)
            calls.closed = last
            if i == 0:
                calls.start()
            calls.supervise(until_drained=not last)

    def set_learners(self, learners: int) -> None:
        """The learner capacity from the next round on (a learner schedule), between rounds only: a sync step's
        size, the invocations a round starts, and the pool that runs them."""
        if self.invocations == self.learners:
            self.invocations = learners
        self.learners = learners
        old, self.pool = self.pool, self._learner_pool()
        old.shutdown(wait=False)

    def _learner_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.invocations + 1, thread_name_prefix=LEARN_THREADS)

    def invoke_actors(self, actors: int, stats: RoundStats) -> list[ActorResult]:
        """One serverless actor invocation per actor, all at once on the actor pool; a call whose instance died is
        made again, up to MAX_RESTARTS times. Returns their results in actor order."""
        futures = [self.actor_pool.submit(self._actor_call, i) for i in range(actors)]
        results = []
        for fut in futures:
            call, restarts = fut.result()
            stats.actor_restarts += restarts
            stats.add(call, "actor")
            results.append(stats.actor_results[-1])
        return results

    def _actor_call(self, index: int) -> tuple[Call, int]:
        event = {"job": self.job.keys.job, "actor_id": f"actor-{index}", "actor_index": index}
        last: BaseException | None = None
        for restarts in range(MAX_RESTARTS):
            try:
                return self.functions.invoke("actor", event), restarts
            except Exception as exc:
                if not self.functions.died(exc):
                    raise
                last = exc
        raise TrainingError(f"actor invocations failed {MAX_RESTARTS} times in a row; the last: {last}")

    def close(self) -> None:
        """Stop taking calls; calls still running are not waited for (stopping the round ends them)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.actor_pool.shutdown(wait=False, cancel_futures=True)


def stuck_calls(grace_s: float) -> list[str]:
    """The call threads (of every Rounds, closed) still running after `grace_s`: each waits on a gateway that answers
    nothing but keeps its connection open (stopped, stuck). The interpreter's exit joins pool threads, so it would
    wait for their calls' timeouts (an hour); the caller leaves them instead."""
    deadline = time.monotonic() + grace_s
    calls = [t for t in threading.enumerate() if t.name.startswith(CALL_THREADS)]
    for thread in calls:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in calls if t.is_alive()]


# --- the learner gate: a round's batches ------------------------------------------------------------------------

BATCH_WAIT_S = 300.0  # no batch landing for this long: the actors are taken for dead
ACTOR_CHECK_S = 1.0  # while waiting, how often dead serverful actors (and time-based conditions) are looked at
CLAIMER = "control"  # the consumer-group name the control plane's learner trigger claims under

ROUND_ONE = LearnerTrigger()  # a train batch of steps, with each actor's first batch (below)


@dataclass(frozen=True)
class Intake:
    """What the gate reads while it collects round `round_k`: the round's train batch size, the actor count (round 1
    waits for each actor's first batch), the serverful actors (hung ones killed, dead ones restarted, landings noted;
    none under serverless actors) and the policy version now (a round trip: read only where a condition needs it)."""

    round_k: int
    train_batch_size: int
    actors: int
    crew: ServerfulActors
    version: Callable[[], int | None]


@dataclass(frozen=True)
class Collected:
    """A firing: the round's batches, those claimed beyond round 1's choice (the next round's first), each landing
    actor's newest reward-scaler moments, and the facts the trigger fired on (its triggers.csv row's)."""

    batches: list[Landed]
    carried: list[Landed]
    reward_scalers: dict[str, list[float]]
    fired: dict[str, Any]

    @property
    def ids(self) -> list[str]:
        return [bid for bid, _ in self.batches]

    @property
    def env_steps(self) -> int:
        return sum(meta.env_steps for _, meta in self.batches)


class LearnerGate:
    """One job's learner trigger and what it remembers between firings (when and at which version it fired)."""

    def __init__(
        self, trigger: LearnerTrigger, job: JobCache, saved: Mapping[str, Any] | None = None, *, payloads: bool = True
    ) -> None:
        """`saved`: a checkpoint's `state()`, so a resumed run's `version_changed` and `period_s` conditions count
        from the dead run's last firing (its downtime not included). `payloads`: batches carry their arrays (the
        `trajectories` profile; a header alone is the whole batch under `gradients_at_actors`)."""
        self.trigger = trigger
        self.claims = BatchClaims(
            job.trajectories.stream,
            job.dead_letters,
            version_key=job.keys.policy_version,
            payloads=payloads,
            max_bytes=job.limits.payload_bytes_max,
        )
        saved = saved or {}
        since = saved.get("since_fire_s")
        self.fired_at: float | None = None if since is None else time.monotonic() - float(since)
        version = saved.get("fired_version")
        self.fired_version: int | None = None if version is None else int(version)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the last firing's version and how long ago it was."""
        since = None if self.fired_at is None else round(time.monotonic() - self.fired_at, 4)
        return {"fired_version": self.fired_version, "since_fire_s": since}

    def facts(self, round_k: int, batches: list[Landed], version: int) -> LandedFacts:
        since = math.inf if self.fired_at is None else time.monotonic() - self.fired_at
        return LandedFacts(
            round=round_k,
            batches=len(batches),
            steps=sum(m.env_steps for _, m in batches),
            actors=actors_in(batches),
            version=version,
            fired_version=self.fired_version,
            since_fire_s=since,
        )

    def _wait_s(self, facts: LandedFacts) -> float:
        """How long a claim may block: until a period condition comes due, at most ACTOR_CHECK_S."""
        period = self.trigger.period_s
        if period is None or math.isinf(facts.since_fire_s):
            return ACTOR_CHECK_S
        return min(ACTOR_CHECK_S, max(0.001, period - facts.since_fire_s))

    def collect(self, intake: Intake, carried: list[Landed], rs: RoundStats) -> Collected:
        """Claim batches after `carried` (the last round's beyond its own) until the trigger fires (round 1: and
        every actor has landed one). Dead serverful actors are restarted, hung ones killed, while it waits."""
        k, crew, need = intake.round_k, intake.crew, intake.train_batch_size
        batches = list(carried)
        scalers: dict[str, list[float]] = {}  # each landing actor's newest reward-scaler moments
        last_landing = time.monotonic()
        while True:
            # Every look, not only after a claim that came back empty: an actor that died while the learners worked
            # would otherwise be found only once the others' batches are in and a claim has waited in vain.
            if time.monotonic() - last_landing >= ACTOR_CHECK_S:  # waiting: an actor may be hung (actor_watch.py)
                crew.kill_hung()
            rs.actor_restarts += crew.restart_dead()
            # The version costs a round trip: read it per look only where a condition needs it.
            facts = self.facts(k, batches, intake.version() or 0 if self.trigger.needs_version else -1)
            # Round 1 is every actor's first batch whatever the trigger (a serverful actor waits after its first
            # batch for the policy it trains, so no count beyond one batch per actor could be met).
            trigger = self.trigger if k > 1 else ROUND_ONE
            held = trigger.held(facts, train_batch_size=need)
            if all(held.values()) and (k != 1 or actors_in(batches) >= intake.actors):
                break
            if len(batches) >= self.claims.stream.maxlen and not (held.get("batches", 1) and held.get("steps", 1)):
                raise TrainingError(
                    f"triggers.learner: {len(batches)} batches ({facts.steps} steps) fill the trajectory queue's bound "
                    "and the trigger's counts still do not hold; ask for fewer steps or raise actor_run_ahead"
                )
            if time.monotonic() - last_landing > BATCH_WAIT_S:
                raise TrainingError(f"no trajectory batch arrived within {BATCH_WAIT_S:.0f} s: are the actors alive?")
            want = trigger.batches_short(len(batches))
            got = self.claims.claim(CLAIMER, at_least=want, at_most=want, block_s=self._wait_s(facts))
            # Nothing landed: a claim whose reply died with Redis may hold batches no later claim returns.
            got = got or self.claims.orphaned(CLAIMER, known={bid for bid, _ in batches})
            batches += got
            crew.landed({b.actor_id for _, b in got})
            scalers |= {b.actor_id: b.info["reward_scaler"] for _, b in got if "reward_scaler" in b.info}
            rs.redis_round_trips += sum(int(b.info.get("redis_round_trips", 0)) for _, b in got)
            if got:
                last_landing = time.monotonic()
        beyond: list[Landed] = []
        if k == 1:  # the same seed, the same round 1 (docs/training.md)
            batches, beyond = first_of_each(batches)
        facts = replace(facts, version=intake.version() or 0) if facts.version < 0 else facts
        self.fired_at, self.fired_version = time.monotonic(), facts.version
        fired = {**asdict(facts), "since_fire_s": _finite(facts.since_fire_s), "held": sorted(held)}
        fired["fired_unix"] = time.time()  # to set against the activation records' clocks
        return Collected(batches, beyond, scalers, fired)


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 4)
