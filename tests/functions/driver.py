"""A plain loop that drives the three handlers through the cache (no gateway): for tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from cache import Cache, JobCache, JobLimits, LearnerTask
from functions.context import Context, Instance
from functions.handlers import actor, learner, parameter
from functions.jobspec import JobSpec, save_spec

Invoke = Callable[[dict[str, Any]], dict[str, Any]]


def local(handler: Callable[[dict[str, Any], Context], dict[str, Any]], instance: Instance) -> Invoke:
    return lambda event: handler(event, Context(uuid.uuid4().hex[:12], instance))


def applied_log(job: JobCache) -> list[dict[str, Any]]:
    """Every aggregation in the job's applied log: version, decision, round and its gradients (id, task id, round,
    base version, staleness)."""
    out = []
    for _, f in job.client.xrange(job.keys.applied):
        out.append(
            {
                "version": int(f[b"version"]),
                "decision": f[b"decision"].decode(),
                "round": int(f[b"round"]),
                "gradients": msgpack.unpackb(f[b"gradients"]),
            }
        )
    return out


class Driver:
    def __init__(self, cache: Cache, spec: JobSpec, *, actors: int = 1, limits: JobLimits | None = None) -> None:
        self.job = JobCache(cache.client, spec.job, limits)
        self.spec = spec
        self.actors = actors
        self.instance = Instance(cache)
        self.instance.jobs[spec.job] = self.job
        self.actor = local(actor.handle, self.instance)
        self.learner = local(learner.handle, self.instance)
        self.parameter = local(parameter.handle, self.instance)
        save_spec(self.job, spec)
        self.parameter({"job": spec.job, "init": True})
        self.returns: list[float] = []
        self.round = 0

    def collect(self) -> list[str]:
        ids = []
        for i in range(self.actors):
            out = self.actor({"job": self.spec.job, "actor_id": f"actor-{i}", "actor_index": i})
            self.returns += out["episode_returns"]
            ids.append(out["batch_id"])
        taken = self.job.trajectories.take("driver", count=len(ids), block_s=5.0)
        assert [t for t, _ in taken] == ids
        return ids

    def tasks(self, batch_ids: list[str], epochs: range) -> list[LearnerTask]:
        m = self.spec.algo.num_minibatches
        return [LearnerTask(self.round, tuple(batch_ids), e, i, m) for e in epochs for i in range(m)]

    def enqueue(self, tasks: list[LearnerTask], *, close: bool) -> list[str]:
        return self.job.board.enqueue(tasks, close_round=self.round if close else None, timeout_s=5.0)

    def run_round(self, *, mode: str, learn_inline: bool = True) -> dict[str, Any]:
        """One round. Inline: one learner invocation works through the round's tasks, then the parameter function
        runs until nothing is queued or in flight. Otherwise learner processes (started by the test, one invocation
        per round each) do the work while the parameter function runs here on a thread, applying gradients as
        they land. Sync mode enqueues one epoch per step, the next once the step's update is out. Returns the
        parameter invocation's result."""
        import threading

        self.round += 1
        batch_ids = self.collect()
        epochs = self.spec.algo.num_epochs
        steps = [range(e, e + 1) for e in range(epochs)] if mode == "sync" else [range(epochs)]
        result: dict[str, Any] = {}
        serve = threading.Thread(
            target=lambda: result.update(self.parameter({"job": self.spec.job, "round": self.round, "max_s": 300}))
        )
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            self.enqueue(self.tasks(batch_ids, step), close=last)
            if learn_inline:
                if last:
                    assert self.learner({"job": self.spec.job, "round": self.round})["status"] == "done"
                else:
                    self._learn_step()
                self.parameter({"job": self.spec.job})
            elif i == 0:
                serve.start()
            if not learn_inline and not last:
                self.wait_drained()
        if not learn_inline:
            serve.join(timeout=300)
            assert not serve.is_alive() and result.get("status") == "ok", result
        self.job.trajectories.ack(batch_ids)
        return result

    def _learn_step(self) -> None:
        """Compute the tasks enqueued so far without closing the round (a sync step): claim until none is left."""
        from cache import GradientMeta, GradientRecord
        from functions.handlers import Stopwatch
        from functions.handlers.learner import _gradient
        from functions.warm import spec_of

        ctx = Context(uuid.uuid4().hex[:12], self.instance)
        spec = spec_of(ctx, self.job)
        lid = f"step-{ctx.call_id}"
        finished = None
        while (claim := self.job.board.claim(lid, finished=finished)).task is not None:
            task = LearnerTask.from_fields(claim.task.fields)
            grads, stats = _gradient(ctx, self.job, spec, task, claim, lid, Stopwatch())
            meta = GradientMeta(lid, claim.version, claim.task.id, task.round, stats)
            finished = (claim.task.id, GradientRecord(meta, grads))
        self.job.board.leave(lid)

    def wait_drained(self, timeout_s: float = 120.0) -> None:
        """Block on published versions until no task is outstanding and no gradient is queued."""
        import time

        deadline = time.monotonic() + timeout_s
        while self.job.board.outstanding() or self.job.gradients.length():
            assert time.monotonic() < deadline, "the round's tasks and gradients did not drain"
            self.job.policies.wait_for_version(self.job.policies.version() or 0, timeout_s=0.5)
