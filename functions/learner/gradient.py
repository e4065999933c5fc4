"""One task's gradient, computed where the data is: by a learner function (the ``trajectories`` profile) or by the
actor that collected the batch (``gradients_at_actors``). Both call these two functions, so the two profiles run the
same algorithm code: `task_inputs` picks the policies a task needs (its version, the versions other holders hold for
truncation, the target network) through the instance's warm policy cache; `gradient_record` computes the
algorithm's gradient, the round's observation moments (of its fresh batches) with the last task, and brings the
tensors back to the CPU for the wire (no I/O)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from cache import GradientMeta, GradientRecord, JobCache, LearnerTask, VersionNotFound
from cache.replay import is_replay_id
from contract.jobspec import JobSpec
from contract.records import ObsMoments
from functions.algos.algorithm import LearnInputs
from functions.algos.registry import algorithm_of
from functions.learner.learn import obs_moments
from functions.model.device import to_cpu
from functions.model.policies import ActorCritic
from functions.model.warm import policy_at
from functions.runtime.context import Context
from functions.runtime.stopwatch import Stopwatch


def _policy_or_none(
    ctx: Context, job: JobCache, spec: JobSpec, version: int, keep: Collection[ActorCritic]
) -> ActorCritic | None:
    try:
        return policy_at(ctx, job, spec, version, keep=keep)
    except VersionNotFound:
        return None  # retired past the newest K versions


def task_inputs(
    ctx: Context,
    job: JobCache,
    spec: JobSpec,
    *,
    version: int,
    weights: bytes | None,
    held: dict[str, int],
    holder: str,
    kl_coef: float | None,
    target_version: int | None,
    keep: Collection[ActorCritic] = (),
) -> tuple[ActorCritic, LearnInputs]:
    """The policy of `version` (from `weights` when given) and what its gradient takes besides: the distinct
    versions other holders hold (`held`: holder id -> version; truncation, paper Eq. 2), the target network, the
    aggregator's KL coefficient. `keep`: modules in use meanwhile, not reloaded (`warm.policy_at`)."""
    policy = policy_at(ctx, job, spec, version, weights, keep=keep)
    keep = (*keep, policy)
    versions = sorted({v for hid, v in held.items() if hid != holder and v != version})
    others = [p for p in (_policy_or_none(ctx, job, spec, v, keep) for v in versions) if p is not None]
    target = None
    if algorithm_of(spec.algo).uses_target(spec.algo):
        chosen = target_version if target_version is not None else version
        target = _policy_or_none(ctx, job, spec, chosen, (*keep, *others)) or policy
    return policy, LearnInputs(others=others, target=target, kl_coef=kl_coef, seed=spec.seed)


def _last_of_round(task: LearnerTask, spec: JobSpec) -> bool:
    return task.epoch == spec.algo.num_epochs - 1 and task.minibatch == task.num_minibatches - 1


def gradient_record(
    spec: JobSpec,
    policy: ActorCritic,
    data: Any,
    batches: Sequence[Any],
    task: LearnerTask,
    inputs: LearnInputs,
    *,
    task_id: str,
    learner_id: str,
    base_version: int,
    device: str,
    compute: Stopwatch,
) -> GradientRecord:
    """The gradient of `task` at `policy` (version `base_version`) over the round's prepared `data`; `batches` are
    the round's arrays in `task.batch_ids` order (observation moments: of the fresh ones only, none without any).
    Algorithm time is added to `compute`."""
    with compute:
        grads, stats = algorithm_of(spec.algo).gradient(policy, data, task, spec.algo, inputs)
    moments = None
    # Replayed batches were folded in when they were fresh: counting them again would bias the statistics.
    fresh = [b for bid, b in zip(task.batch_ids, batches, strict=True) if not is_replay_id(bid)]
    if policy.obs_normalizer is not None and _last_of_round(task, spec) and fresh:
        # Once per round, with its last task: the round's observation moments, folded into the normaliser by the
        # parameter function. Every gradient of the round is then taken on the inputs as the batch's actor
        # normalised them (as CleanRL trains on observations normalised at collection), and the next round's
        # actors and learners start from statistics that include this round's batch.
        with compute:
            m = obs_moments(policy, fresh)
            moments = ObsMoments(m.mean.cpu(), m.var.cpu(), m.count)
    with compute:
        grads = to_cpu(grads)
    meta_stats = {**stats, "epoch": task.epoch, "minibatch": task.minibatch, "device": device}
    return GradientRecord(GradientMeta(learner_id, base_version, task_id, task.round, meta_stats), grads, moments)
