"""Learner function: one invocation works through a round's tasks while any remain. For each task it takes the
newest policy version (weights reloaded only when the version changed), registers the version it holds so others
truncate against it, computes one gradient with truncation, and stores it together with the task's ack. It
leaves once the round is closed and no task is outstanding; while others still hold tasks it waits, so that it
can take over the task of a learner that died (once its lease ran out, or sooner: the control plane evicts a
learner whose instance the platform reports killed).

Claiming ahead (`stellaris.claim_ahead`, every rule but sync): the round trip that stores a task's gradient and
claims the next task is sent before the learner computes the task it already holds and read after
(`functions.learner.claim_ahead`), so the cache I/O is off the computation's path. The next
task's policy is then the newest when the claim ran, one gradient earlier than a claim made after it (about one
version staler)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from cache import CodecError, GradientRecord, JobCache, LearnerTask, RecordError
from contract import LearnerResult
from contract.jobspec import JobSpec
from functions.actor.replay_feedback import write_priorities
from functions.algos.registry import algorithm_of
from functions.handlers import EventError, job_id_of, quiet_on_job_loss
from functions.learner.claim_ahead import Ahead, Finished, Next, claims_ahead
from functions.learner.gradient import gradient_record
from functions.model.device import to_device
from functions.model.policies import ActorCritic
from functions.model.warm import spec_of
from functions.runtime.context import Context, PreparedRound
from functions.runtime.faults import fault_point
from functions.runtime.stopwatch import Stopwatch

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


def _prepared(
    ctx: Context, job: JobCache, spec: JobSpec, task: LearnerTask, policy: ActorCritic, compute: Stopwatch
) -> PreparedRound:
    """The round's data, prepared by the first task of the round on this instance (on the CPU: GAE runs in time
    order), moved to the instance's device and completed with what that task's policy says of it; only the newest
    round is kept."""
    rounds = ctx.memo.rounds
    prepared = rounds.get(job.keys.job)
    if prepared is None or prepared.batch_ids != task.batch_ids:
        batches = _batches(job, task)
        algo = algorithm_of(spec.algo)
        with compute:
            data = algo.with_policy(to_device(algo.prepare(batches, spec.algo), ctx.device), policy, spec.algo)
        prepared = rounds[job.keys.job] = PreparedRound(task.batch_ids, batches, data)
    return prepared


def task_gradient(
    ctx: Context, job: JobCache, spec: JobSpec, nxt: Next, task: LearnerTask, learner_id: str, compute: Stopwatch
) -> GradientRecord:
    """One task's gradient record at its claim's version, truncating against the other held versions (the policies
    `nxt` loaded), computed on the instance's device; its tensors come back to the CPU for the wire, and its stats
    name the device."""
    assert nxt.claim.task is not None and nxt.inputs is not None
    policy, inputs = nxt.inputs
    prepared = _prepared(ctx, job, spec, task, policy, compute)
    return gradient_record(
        spec,
        policy,
        prepared.data,
        prepared.batches,
        task,
        inputs,
        task_id=nxt.claim.task.id,
        learner_id=learner_id,
        base_version=nxt.claim.version,
        device=str(ctx.device),
        compute=compute,
    )


def _counted(out: LearnerResult, nxt: Next) -> LearnerResult:
    """`out` with what the claim `nxt` reports: the gradient it carried stored or lost (our lease ran out and the
    task was taken over; its other holder stores it), and the orphans it gave up on."""
    if nxt.carried is not None:
        out = replace(out, lost=out.lost + 1) if nxt.claim.lost else out.with_gradient(nxt.carried.meta.stats)
    return replace(out, dead_lettered=out.dead_lettered + nxt.claim.dead_lettered)


@quiet_on_job_loss
def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    job = ctx.job(job_id_of(event))
    device = ctx.device  # a bad STELLARIS_DEVICE fails the call here, before it takes any task
    spec = spec_of(ctx, job)
    round_k = event.get("round")
    if not isinstance(round_k, int) or isinstance(round_k, bool) or round_k < 1:
        raise EventError(f"event needs a 'round' field with the round number (an int >= 1), got {round_k!r}")
    learner_id = str(event.get("learner_id") or f"learner-{ctx.call_id}")
    deadline = time.monotonic() + float(event.get("max_s", 3000.0))
    board = job.board
    trips0 = ctx.instance.cache.round_trips
    compute, waited = Stopwatch(), Stopwatch()
    out = LearnerResult()
    finished: Finished | None = None  # stored together with the next claim: one round trip
    held: int | None = None  # the version of the last task's policy: a claim of the same version sends no weights
    with board.leased(learner_id), Ahead(ctx, job, spec, learner_id, claims_ahead(spec)) as ahead:
        nxt = ahead.now(held=held, finished=None)
        while time.monotonic() < deadline:
            out = _counted(out, nxt)
            claim = nxt.claim
            if claim.task is None:
                if finished is not None:  # computed while the claim ran, which found no next task: store it now
                    nxt, finished = ahead.now(held=held, finished=finished), None
                    continue
                if claim.closed_round >= round_k and claim.outstanding == 0:
                    break
                # Others hold the remaining tasks (or more are coming): wait for an ack or an enqueue, at most
                # until the earliest foreign lease runs out, when a dead holder's task becomes ours to take.
                until_expiry_s = (
                    IDLE_WAIT_S if claim.next_expiry_ms is None else (claim.next_expiry_ms - claim.now_ms) / 1000
                )
                with waited:
                    board.wait(min(IDLE_WAIT_S, max(until_expiry_s + 0.01, 0.01)))
                nxt = ahead.now(held=held, finished=None)
                continue
            task_id, held = claim.task.id, claim.version
            # Store the last gradient and claim the next task while this one is computed (claiming ahead).
            ahead.start(held=held, finished=finished, holding=nxt)
            finished = None
            record: GradientRecord | None = None
            try:
                task = LearnerTask.from_fields(claim.task.fields)
                record = task_gradient(ctx, job, spec, nxt, task, learner_id, compute)
                write_priorities(job, task, record.meta.stats)  # prioritized replay only (else no priorities)
            except (CodecError, RecordError, BatchGone) as exc:
                # Poison: it would fail the same way on every attempt. Give up on it now, visibly.
                ctx.log.warning("dead-lettering task %s: %s", task_id, exc)
                gone = board.dead_letter(learner_id, task_id, f"{type(exc).__name__}: {exc}")
                out = replace(out, dead_lettered=out.dead_lettered + int(gone))
            if record is not None:
                fault_point("learner:before_complete")
            nxt, finished = ahead.after(held=held, done=(task_id, record) if record is not None else None)
        else:  # past the deadline: the last claim counted; an unsent gradient stays so (taken over once we leave)
            out = _counted(out, nxt)
    return replace(
        out,
        status="done" if time.monotonic() < deadline else "timeout",
        compute_s=compute.seconds,
        wait_s=waited.seconds,
        redis_round_trips=ctx.instance.cache.round_trips - trips0,
        device=str(device),
    ).to_dict()
