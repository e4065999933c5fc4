"""The ``gradients_at_actors`` distribution profile (actor-learner fusion, A3C style; MSRL's distribution policies):
the actor that collected a batch computes the learner's gradients over it, next to its envs, and ships only the
gradients, then a header of the batch (env steps, returns) for the control plane to count. The arrays never cross
the cache.

The gradients are the learner's: the same `functions.learner.gradient` code, over the same epochs and minibatch size (a
batch of a fraction f of the train batch gets f of the round's minibatches), each task at the newest policy version
(looked up before every task, as a learner's claim does), truncating against the versions other holders hold (the
actor registers the version it holds, as a learner does) and with the aggregator's KL coefficient and target
network. They land on the job's gradient stream in the learners' record format, so the parameter function applies
them unchanged: each exactly once (`cache.tasks` makes a retried push store nothing).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from cache import BatchMeta, JobCache, LearnerTask, TrajectoryBatch
from cache.tasks import ActorGradients
from contract.jobspec import JobSpec
from functions.algos.registry import algorithm_of
from functions.learner.gradient import gradient_record, task_inputs
from functions.model.device import to_device
from functions.runtime.context import Context
from functions.runtime.stopwatch import Stopwatch


def batch_minibatches(env_steps: int, *, train_batch_size: int, num_minibatches: int) -> int:
    """Minibatches of one actor's batch: its share of the round's, so that minibatches keep the learner's size
    (at least one)."""
    if env_steps < 1 or train_batch_size < 1 or num_minibatches < 1:
        raise ValueError(
            f"env_steps ({env_steps}), train_batch_size ({train_batch_size}) and num_minibatches "
            f"({num_minibatches}) must be positive"
        )
    return max(1, round(num_minibatches * env_steps / train_batch_size))


def batch_tasks(round_k: int, batch_id: str, *, epochs: int, minibatches: int) -> list[LearnerTask]:
    """One task per (epoch, minibatch) of one batch, in the learners' order (epoch-major)."""
    return [LearnerTask(round_k, (batch_id,), e, i, minibatches) for e in range(epochs) for i in range(minibatches)]


@dataclass(frozen=True)
class Shipped:
    header_id: str
    gradients: int
    compute_s: float


def ship_gradients(ctx: Context, job: JobCache, spec: JobSpec, batch: TrajectoryBatch) -> Shipped:
    """Compute and store the gradients of `batch`, then its header (the control plane counts the round from it);
    returns the header's id. The round is the one being collected (the newest closed round + 1)."""
    trips0 = ctx.instance.cache.round_trips
    cfg, algo = spec.algo, algorithm_of(spec.algo)
    round_k = int(job.client.get(job.keys.tasks_closed) or 0) + 1
    batch_id = f"{batch.actor_id}-{uuid.uuid4().hex[:10]}"  # the gradients' task ids: unique per push
    m = batch_minibatches(batch.env_steps, train_batch_size=cfg.train_batch_size, num_minibatches=cfg.num_minibatches)
    tasks = batch_tasks(round_k, batch_id, epochs=cfg.num_epochs, minibatches=m)
    compute = Stopwatch()
    with compute:
        prepared = to_device(algo.prepare([batch.arrays], cfg), ctx.device)
    data: Any = None  # completed by the first task's policy
    pusher = ActorGradients(job.client, job.keys, maxlen=job.limits.gradient_maxlen, ttl_s=job.limits.ttl_s)
    holder = f"fused-{batch.actor_id}"
    version: int | None = None
    try:
        for task in tasks:
            weights: bytes | None = None
            newer = job.policies.newer_than(version)
            if newer is not None:
                version, weights = newer
            assert version is not None
            job.learners.register(holder, version)
            state = job.aggregator.get()
            policy, inputs = task_inputs(
                ctx,
                job,
                spec,
                version=version,
                weights=weights,
                held=job.learners.in_flight(),
                holder=holder,
                kl_coef=state.kl_coef,
                target_version=state.target_version,
            )
            if data is None:
                with compute:
                    data = algo.with_policy(prepared, policy, cfg)
            record = gradient_record(
                spec,
                policy,
                data,
                [batch.arrays],
                task,
                inputs,
                task_id=f"{batch_id}:{task.epoch}:{task.minibatch}",
                learner_id=holder,
                base_version=version,
                device=str(ctx.device),
                compute=compute,
            )
            pusher.put(holder, record, timeout_s=job.limits.backpressure_timeout_s)
    finally:
        job.learners.deregister(holder)
    trips = ctx.instance.cache.round_trips - trips0 + 1  # the header's push included
    info: dict[str, Any] = {
        **batch.info,
        "redis_round_trips": int(batch.info.get("redis_round_trips", 0)) + trips,
        "gradients": len(tasks),
        "gradient_compute_s": compute.seconds,
    }
    meta = BatchMeta(batch.actor_id, batch.behaviour_version, batch.env_steps, info)
    return Shipped(job.trajectories.put_header(meta), len(tasks), compute.seconds)
