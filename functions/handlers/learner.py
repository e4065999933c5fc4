"""Learner function: take one task, register the policy version held, compute one gradient with truncation,
push it and ACK the task in one atomic step, deregister."""

from __future__ import annotations

from typing import Any

from cache import GradientRecord, JobCache, LearnerTask, VersionNotFound
from functions.algos.config import IMPACTConfig
from functions.context import Context
from functions.handlers import Stopwatch, job_id_of
from functions.learn import impact_gradient, obs_moments, ppo_gradient, prepare_ppo_round
from functions.warm import policy_at, spec_of


def _batches(job: JobCache, task: LearnerTask) -> list[Any]:
    out = []
    for bid in task.batch_ids:
        batch = job.trajectories.get(bid)
        if batch is None:
            raise LookupError(f"trajectory batch {bid} of round {task.round} is gone from the cache")
        out.append(batch.arrays)
    return out


def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    job = ctx.job(job_id_of(event))
    learner_id = str(event.get("learner_id") or f"learner-{ctx.call_id}")
    spec = spec_of(ctx, job)
    block_s = float(event.get("block_s", 0.0))

    entries = job.tasks.read(learner_id, count=1, block_s=block_s)
    if not entries and "reclaim_idle_s" in event:  # a dead learner's task, idle past its lease
        entries = job.tasks.reclaim(learner_id, min_idle_s=float(event["reclaim_idle_s"]), count=1)
    if not entries:
        return {"status": "idle"}
    entry = entries[0]
    task = LearnerTask.decode(entry.payload)

    version = event.get("version")
    version = int(version) if version is not None else job.policies.version()
    assert version is not None
    job.learners.register(learner_id, version)
    compute = Stopwatch()  # time in the algorithm; the rest of the handler is cache I/O and (de)serialisation
    batches: list[Any] | None = None  # fetched at most once per call
    try:
        policy = policy_at(ctx, job, spec, version)
        others = []
        for v in job.learners.held_versions():
            if v != version:
                try:
                    others.append(policy_at(ctx, job, spec, v))
                except VersionNotFound:
                    continue  # retired past the newest K versions: nothing to truncate against
        agg = job.client.hgetall(job.keys.aggregator)
        kl_coef = float(agg[b"kl_coef"]) if b"kl_coef" in agg else None
        if isinstance(spec.algo, IMPACTConfig):
            target_version = int(float(agg.get(b"target_version", version)))
            try:
                target = policy_at(ctx, job, spec, target_version)
            except VersionNotFound:
                target = policy
            batches = _batches(job, task)
            with compute:
                grads, stats = impact_gradient(policy, target, batches, task, spec.algo, others=others, kl_coef=kl_coef)
        else:
            key = f"ppo-round:{job.keys.job}:{','.join(task.batch_ids)}"
            data = ctx.memo.get(key)
            if data is None:  # first task of this round on this instance; keep only the newest round
                for old in [k for k in ctx.memo if k.startswith(f"ppo-round:{job.keys.job}:")]:
                    del ctx.memo[old]
                batches = _batches(job, task)
                with compute:
                    data = prepare_ppo_round(batches, gamma=spec.algo.gamma, lam=spec.algo.lam)
                ctx.memo[key] = data
            with compute:
                grads, stats = ppo_gradient(policy, data, task, spec.algo, others=others, kl_coef=kl_coef)
        stats |= {"round": task.round, "epoch": task.epoch, "minibatch": task.minibatch}
        if policy.obs_normalizer is not None and task.epoch == 0 and task.minibatch == 0:
            # Once per round: the round's observation moments, folded into the normaliser by the parameter
            # function, so actors and learners of one version always share its statistics.
            batches = batches if batches is not None else _batches(job, task)
            with compute:
                grads |= obs_moments(policy, batches)
    finally:
        # Done with the policy: others need not truncate against it any more. Until the push below the task
        # itself still counts as in flight, so the parameter function cannot flush early.
        job.learners.deregister(learner_id)
    record = GradientRecord(learner_id, version, task.batch_ids, grads, stats)
    grad_id = job.gradients.put(record, ack=(job.tasks, [entry.id]))
    return {
        "status": "done", "gradient_id": grad_id, "task_id": entry.id, "base_version": version,
        "compute_s": compute.seconds, **stats,
    }  # fmt: skip
