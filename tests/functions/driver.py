"""Drives the three handlers through the cache with the product's round protocol (`stellaris.round.protocol`),
invoking them in-process instead of through the gateway: for tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from cache import Cache, JobCache, JobLimits, LearnerTask
from contract import AppliedRow, ParameterResult
from contract.jobspec import JobSpec
from contract.knobs import Rule
from functions.handlers import actor, learner, parameter
from functions.runtime.context import Context, Instance
from functions.runtime.jobspec import save_spec
from stellaris.round.protocol import Call, Role, Rounds, RoundStats, round_tasks

Invoke = Callable[[dict[str, Any]], dict[str, Any]]
Handler = Callable[[dict[str, Any], Context], dict[str, Any]]
HANDLERS: dict[Role, Handler] = {"actor": actor.handle, "learner": learner.handle, "parameter": parameter.handle}


def local(handler: Handler, instance: Instance) -> Invoke:
    return lambda event: handler(event, Context(uuid.uuid4().hex[:12], instance))


def applied_log(job: JobCache) -> list[dict[str, Any]]:
    """Every aggregation in the job's applied log: version, decision, round and its gradients (id, task id, round,
    base version, staleness)."""
    rows = [AppliedRow.from_fields(f) for _, f in job.client.xrange(job.keys.applied)]
    return [
        {
            "version": r.version,
            "decision": r.decision,
            "round": r.round,
            "gradients": [g.to_list() for g in r.gradients],
        }
        for r in rows
    ]


class InProcessFunctions:
    """The round protocol's functions as handler calls on this process's threads. As the gateway gives each call a
    single-call instance, concurrent calls never share one: the parameter function has `home`, actor i its own
    (actor 0 `home`, so a test can look into its warm state), learners a free one from a pool. A handler's exception
    is a bug, never a dead instance."""

    def __init__(self, home: Instance) -> None:
        self.home = home
        self.actors: dict[int, Instance] = {0: home}
        self.idle_learners: list[Instance] = []
        self.lock = threading.Lock()

    def _instance(self) -> Instance:
        cache = self.home.cache
        return Instance(cache, jobs=self.home.jobs)  # the same JobCache objects (and limits) as `home`

    def invoke(self, role: Role, event: dict[str, Any]) -> Call:
        with self.lock:
            if role == "learner":
                instance = self.idle_learners.pop() if self.idle_learners else self._instance()
            elif role == "actor":
                index = int(event["actor_index"])
                if index not in self.actors:
                    self.actors[index] = self._instance()
                instance = self.actors[index]
            else:
                instance = self.home
        t0 = time.perf_counter()
        try:
            result = HANDLERS[role](event, Context(uuid.uuid4().hex[:12], instance))
        finally:
            if role == "learner":
                with self.lock:
                    self.idle_learners.append(instance)
        return Call(result, time.perf_counter() - t0)

    def died(self, exc: BaseException) -> bool:
        return False

    def gone(self, exc: BaseException) -> bool:
        return False


class Driver:
    """One job on the three handlers. `learners` is the learner capacity the round protocol plans with (a sync
    step's size, and how many learner invocations an inline round starts)."""

    def __init__(
        self, cache: Cache, spec: JobSpec, *, actors: int = 1, limits: JobLimits | None = None, learners: int = 2
    ) -> None:
        self.job = JobCache(cache.client, spec.job, limits)
        self.spec = spec
        self.actors = actors
        self.learners = learners
        self.instance = Instance(cache)
        self.instance.jobs[spec.job] = self.job
        self.functions = InProcessFunctions(self.instance)
        self.actor = local(actor.handle, self.instance)
        self.learner = local(learner.handle, self.instance)
        self.parameter = local(parameter.handle, self.instance)
        save_spec(self.job, spec)
        self.parameter({"job": spec.job, "init": True})
        self.returns: list[float] = []
        self.round = 0

    def _rounds(self, mode: Rule, *, invocations: int) -> Rounds:
        return Rounds(
            self.job,
            self.functions,
            mode=mode,
            learners=self.learners,
            actors=self.actors,
            invocations=invocations,
            enqueue_timeout_s=5.0,
        )

    def collect(self) -> list[str]:
        """One serverless actor invocation per actor (the protocol's), then their batches taken off the stream."""
        rounds = self._rounds("stellaris", invocations=0)  # the mode plays no part in invoking actors
        try:
            results = rounds.invoke_actors(self.actors, RoundStats())
        finally:
            rounds.close()
        ids = []
        for out in results:
            self.returns += out.episode_returns
            ids.append(out.batch_id)
        taken = self.job.trajectories.take("driver", count=len(ids), block_s=5.0)
        assert sorted(t for t, _ in taken) == sorted(ids)
        return [t for t, _ in taken]

    def tasks(self, batch_ids: list[str], epochs: range) -> list[LearnerTask]:
        m = self.spec.algo.num_minibatches
        return [LearnerTask(self.round, tuple(batch_ids), e, i, m) for e in epochs for i in range(m)]

    def enqueue(self, tasks: list[LearnerTask], *, close: bool) -> list[str]:
        return self.job.board.enqueue(tasks, close_round=self.round if close else None, timeout_s=5.0)

    def run_round(self, *, mode: Rule, learn_inline: bool = True) -> ParameterResult:
        """One round through the product's round protocol. Inline: the protocol starts `learners` learner
        invocations here, on threads. Otherwise learner processes (started by the test, one invocation per round
        each) do the work. Either way the parameter function runs here on a thread, applying gradients as they
        land; a sync round is steps of `learners` tasks, the next enqueued once the step's update is out. Returns
        the parameter invocation's result."""
        self.round += 1
        batch_ids = self.collect()
        algo = self.spec.algo
        tasks = round_tasks(self.round, batch_ids, epochs=algo.num_epochs, minibatches=algo.num_minibatches)
        stats = RoundStats()
        rounds = self._rounds(mode, invocations=self.learners if learn_inline else 0)
        try:
            rounds.learn(self.round, tasks, stats)
        finally:
            rounds.close()
        self.job.trajectories.ack(batch_ids)
        assert stats.parameter_results and stats.parameter_results[-1].status == "ok", stats
        return stats.parameter_results[-1]

    def wait_drained(self, timeout_s: float = 120.0) -> None:
        """Block on published versions until no task is outstanding and no gradient is queued."""
        deadline = time.monotonic() + timeout_s
        while self.job.board.outstanding() or self.job.gradients.length():
            assert time.monotonic() < deadline, "the round's tasks and gradients did not drain"
            self.job.policies.wait_for_version(self.job.policies.version() or 0, timeout_s=0.5)
