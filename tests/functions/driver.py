"""A plain loop that drives the three handlers through the cache (no gateway): for tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from cache import Cache, JobCache, LearnerTask
from functions.context import Context, Instance
from functions.handlers import actor, learner, parameter
from functions.jobspec import JobSpec, save_spec

Invoke = Callable[[dict[str, Any]], dict[str, Any]]


def local(handler: Callable[[dict[str, Any], Context], dict[str, Any]], instance: Instance) -> Invoke:
    return lambda event: handler(event, Context(uuid.uuid4().hex[:12], instance))


class Driver:
    def __init__(self, cache: Cache, spec: JobSpec, *, actors: int = 1) -> None:
        self.job = JobCache(cache.client, spec.job)
        self.spec = spec
        self.actors = actors
        self.instance = Instance(cache)
        self.actor = local(actor.handle, self.instance)
        self.learner = local(learner.handle, self.instance)
        self.parameter = local(parameter.handle, self.instance)
        save_spec(self.job, spec)
        self.parameter({"job": spec.job, "init": True})
        self.returns: list[float] = []
        self.decisions: list[dict[str, Any]] = []
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

    def drain(self, *, learn_inline: bool, sync_expected: int | None = None) -> None:
        """Run the parameter function until every task of the round is aggregated."""
        last = "0-0"
        while True:
            if learn_inline:
                self.learner({"job": self.spec.job})
            out = self.parameter({"job": self.spec.job, "sync_expected": sync_expected})
            self.decisions += out["decisions"]
            if self.job.tasks.length() == 0 and not self.job.gradients.queued(parameter.CONSUMER):
                return
            if not learn_inline:  # wait for the next gradient (an event), not a timer
                reply = self.job.client.xread({self.job.keys.grad: last}, count=1, block=5000)
                if reply:
                    last = reply[0][1][-1][0]

    def run_round(self, *, mode: str, learn_inline: bool = True) -> None:
        self.round += 1
        batch_ids = self.collect()
        epochs = self.spec.algo.num_epochs
        if mode == "sync":
            for e in range(epochs):  # one synchronous step per epoch: all minibatches on one version
                self.job.enqueue_tasks(self.tasks(batch_ids, range(e, e + 1)))
                self.drain(learn_inline=learn_inline, sync_expected=self.spec.algo.num_minibatches)
        else:
            self.job.enqueue_tasks(self.tasks(batch_ids, range(epochs)))
            self.drain(learn_inline=learn_inline)
        self.job.trajectories.ack(batch_ids)
