"""Learner function: one invocation works through a round's tasks while any remain. For each task it takes the
newest policy version (weights reloaded only when the version changed), registers the version it holds so others
truncate against it, computes one gradient with truncation, and stores it together with the task's ack. It
leaves once the round is closed and no task is outstanding; while others still hold tasks it waits, so that it
can take over the task of a learner that died (after that learner's lease ran out)."""

from __future__ import annotations

import time
from typing import Any

from cache import Claim, CodecError, GradientMeta, GradientRecord, JobCache, LearnerTask, RecordError, VersionNotFound
from functions.algos.config import IMPACTConfig
from functions.context import Context
from functions.faults import fault_point
from functions.handlers import EventError, Stopwatch, job_id_of
from functions.jobspec import JobSpec
from functions.learn import impact_gradient, obs_moments, ppo_gradient, prepare_ppo_round
from functions.warm import policy_at, spec_of

# How long an idle learner waits for work before it looks again (an ack or an enqueue wakes it sooner).
IDLE_WAIT_S = 5.0


class BatchGone(LookupError):
    """A task's trajectory data is no longer in the cache: the task can never be computed."""


def _batches(job: JobCache, task: LearnerTask) -> list[Any]:
    out = []
    for bid in task.batch_ids:
        batch = job.trajectories.get(bid)
        if batch is None:
            raise BatchGone(f"trajectory batch {bid} of round {task.round} is gone from the cache")
        out.append(batch.arrays)
    return out


def _gradient(
    ctx: Context, job: JobCache, spec: JobSpec, task: LearnerTask, claim: Claim, learner_id: str, compute: Stopwatch
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One task's gradient and statistics at the claim's version, truncating against the other held versions."""
    version = claim.version
    policy = policy_at(ctx, job, spec, version, claim.weights)
    others = []
    for other in sorted({v for lid, v in claim.held.items() if lid != learner_id and v != version}):
        try:
            others.append(policy_at(ctx, job, spec, other))
        except VersionNotFound:
            continue  # retired past the newest K versions: nothing to truncate against
    batches: list[Any] | None = None  # fetched at most once per task
    if isinstance(spec.algo, IMPACTConfig):
        target_version = claim.target_version if claim.target_version is not None else version
        try:
            target = policy_at(ctx, job, spec, target_version)
        except VersionNotFound:
            target = policy
        batches = _batches(job, task)
        with compute:
            grads, stats = impact_gradient(
                policy, target, batches, task, spec.algo, others=others, kl_coef=claim.kl_coef
            )
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
            grads, stats = ppo_gradient(policy, data, task, spec.algo, others=others, kl_coef=claim.kl_coef)
    if policy.obs_normalizer is not None and task.epoch == 0 and task.minibatch == 0:
        # Once per round: the round's observation moments, folded into the normaliser by the parameter
        # function, so actors and learners of one version always share its statistics.
        batches = batches if batches is not None else _batches(job, task)
        with compute:
            grads |= obs_moments(policy, batches)
    return grads, stats


def _count(out: dict[str, Any], claim: Claim, record: GradientRecord) -> None:
    if claim.lost:
        out["lost"] += 1  # our lease ran out and the task was taken over: its other holder stores it
        return
    out["gradients"] += 1
    out["loss_sum"] += float(record.meta.stats.get("loss", 0.0))
    if "truncated_fraction" in record.meta.stats:
        out["truncated_sum"] += float(record.meta.stats["truncated_fraction"])
        out["truncated_n"] += 1


def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    job = ctx.job(job_id_of(event))
    spec = spec_of(ctx, job)
    round_k = event.get("round")
    if not isinstance(round_k, int) or isinstance(round_k, bool) or round_k < 1:
        raise EventError(f"event needs a 'round' field with the round number (an int >= 1), got {round_k!r}")
    learner_id = str(event.get("learner_id") or f"learner-{ctx.call_id}")
    deadline = time.monotonic() + float(event.get("max_s", 3000.0))
    board = job.board
    trips0 = ctx.instance.cache.round_trips
    compute, waited = Stopwatch(), Stopwatch()
    out: dict[str, Any] = {"gradients": 0, "lost": 0, "dead_lettered": 0, "loss_sum": 0.0, "truncated_sum": 0.0}
    out["truncated_n"] = 0
    finished: tuple[str, GradientRecord] | None = None  # stored together with the next claim: one round trip
    held: int | None = None
    with board.leased(learner_id):
        while time.monotonic() < deadline:
            claim = board.claim(
                learner_id, held_version=held, finished=finished, timeout_s=job.limits.backpressure_timeout_s
            )
            if finished is not None:
                _count(out, claim, finished[1])
                finished = None
            out["dead_lettered"] += claim.dead_lettered
            if claim.task is None:
                if claim.closed_round >= round_k and claim.outstanding == 0:
                    break
                # Others hold the remaining tasks (or more are coming): wait for an ack or an enqueue, at most
                # until the earliest foreign lease runs out, when a dead holder's task becomes ours to take.
                until_expiry_s = (
                    IDLE_WAIT_S if claim.next_expiry_ms is None else (claim.next_expiry_ms - claim.now_ms) / 1000
                )
                with waited:
                    board.wait(min(IDLE_WAIT_S, max(until_expiry_s + 0.01, 0.01)))
                continue
            task_id = claim.task.id
            try:
                task = LearnerTask.from_fields(claim.task.fields)
                grads, stats = _gradient(ctx, job, spec, task, claim, learner_id, compute)
            except (CodecError, RecordError, BatchGone) as exc:
                # Poison: it would fail the same way on every attempt. Give up on it now, visibly.
                ctx.log.warning("dead-lettering task %s: %s", task_id, exc)
                out["dead_lettered"] += int(board.dead_letter(learner_id, task_id, f"{type(exc).__name__}: {exc}"))
                continue
            held = claim.version
            stats |= {"epoch": task.epoch, "minibatch": task.minibatch}
            meta = GradientMeta(learner_id, claim.version, task_id, task.round, stats)
            fault_point("learner:before_complete")
            finished = (task_id, GradientRecord(meta, grads))
    status = "done" if time.monotonic() < deadline else "timeout"
    trips = ctx.instance.cache.round_trips - trips0
    return {"status": status, "compute_s": compute.seconds, "wait_s": waited.seconds, "redis_round_trips": trips, **out}
