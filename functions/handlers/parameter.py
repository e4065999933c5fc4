"""Parameter function: one long-lived invocation applies the job's gradients as they land, reading as
event → read (`cache.tasks.GradientFeed`) → decide → apply (`functions.parameter.aggregation`) → publish and ack in
one atomic step (`PolicyStore.publish_and_ack`), so a crash anywhere applies every gradient exactly once. It holds the
job's update lease (fenced inside Redis); a replacement takes over once a dead holder's lease runs out and resumes
from the cache."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from cache import FencingError, JobCache, LeaseUnavailable
from cache.learner_registry import WorkSnapshot
from cache.policy_store import UpdateLease
from cache.tasks import GradientFeed, Landed
from contract import DecisionRow, ParameterResult
from functions.handlers import job_id_of, quiet_on_job_loss
from functions.model.warm import spec_of
from functions.parameter.aggregation import Applier, Decided, Poisoned, Queue
from functions.parameter.setup import initialise, kept
from functions.runtime.context import Context
from functions.runtime.faults import fault_point
from functions.runtime.stopwatch import Stopwatch

BLOCK_S = 1.0  # the longest wait between two looks at in-flight work (dead letters change it without a gradient)
DECISIONS_KEPT = 256  # the newest applied decisions returned to the caller (the applied log has them all)


@dataclass
class _Run:
    ctx: Context
    job: JobCache
    lease: UpdateLease
    applier: Applier
    queue: Queue
    feed: GradientFeed
    decisions: deque[DecisionRow] = field(default_factory=lambda: deque(maxlen=DECISIONS_KEPT))
    work: WorkSnapshot | None = None  # the work in flight as the last publish left it: it stands in for a look


@quiet_on_job_loss
def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Apply the job's gradients until none is queued or in flight and round `round` (when given) is closed (later
    rounds' are left to their own round's invocation), or until a stop event or `max_s`. `init` creates the job."""
    job = ctx.job(job_id_of(event))
    device = ctx.device  # a bad STELLARIS_DEVICE fails the call here
    if event.get("init"):
        return initialise(job, event["init"], ctx).to_dict()
    spec, trips0, lease_s = spec_of(ctx, job), ctx.instance.cache.round_trips, job.limits.parameter_lease_s
    deadline, waited = time.monotonic() + float(event.get("max_s", 3000.0)), Stopwatch()
    try:  # a dead holder's lease runs out within lease_s (or is freed sooner by the control plane, which names `owner`)
        owner = str(event.get("owner") or f"param-{ctx.call_id}")
        lease = job.policies.acquire(owner, lease_s=lease_s, wait_s=float(event.get("wait_s", 2 * lease_s + 1)))
    except LeaseUnavailable:
        return ParameterResult(status="busy", device=str(device)).to_dict()
    with kept(job, lease, lease_s) as lost:
        applier = Applier(ctx, job, spec, str(event.get("optimizer", "adam")))
        until, sync_expected = int(event.get("round") or 0), event.get("sync_expected")
        queue = Queue(applier.rule, spec.parameter_trigger, until_round=until, sync_expected=sync_expected)
        run = _Run(ctx, job, lease, applier, queue, GradientFeed(job))
        status = _serve(run, lost, deadline, waited)
        status = "fenced" if status == "fenced" or lost.is_set() or not applier.close(lease) else status
    return ParameterResult(
        status=status,
        version=applier.version,
        decisions=list(run.decisions),
        compute_s=applier.compute.seconds,
        wait_s=waited.seconds,
        redis_round_trips=ctx.instance.cache.round_trips - trips0,
        device=str(device),
    ).to_dict()


def _serve(run: _Run, lost: threading.Event, deadline: float, waited: Stopwatch) -> Literal["ok", "fenced", "expired"]:
    try:
        _read(run, run.feed.read(held=run.applier.version, count=run.job.limits.gradient_maxlen))  # a predecessor's
        while not run.feed.stopped and not lost.is_set():
            if run.queue.from_queue_alone and run.queue.visible() and (decided := _decide(run, None)):
                _apply(run, decided)  # with no look at the work in flight: a round trip saved
                continue
            in_flight, idle = _look(run)
            if decided := _decide(run, in_flight):
                _apply(run, decided)
                continue
            if idle:
                break
            if (remaining := deadline - time.monotonic()) <= 0:
                return "expired"
            with waited:
                _read(run, run.feed.wait(run.queue.block_s(min(BLOCK_S, remaining)), held=run.applier.version))
    except FencingError:
        return "fenced"  # our lease ran out and another holder took over: it carries on from the cache
    return "ok"


def _read(run: _Run, landed: Landed) -> None:
    """Queue what landed by its header; dead-letter the poisoned (whose header, or payload, cannot be applied)."""
    run.queue.add(landed)
    for gid, reason in landed.poisoned:
        run.ctx.log.warning("dead-lettering gradient %s: %s", gid, reason)
        run.feed.drop(gid, reason)
        run.queue.remove([gid])


def _look(run: _Run) -> tuple[tuple[int, ...], bool]:
    work, run.work = run.work or run.job.learners.work_snapshot(), None
    if work.gradients > len(run.queue):  # landed before the look but not read: read now, or a rule would see their
        _read(run, run.feed.read(held=run.applier.version))  # tasks nowhere (those landing after wait: harmless)
    return run.queue.in_flight(work, run.applier.version)


def _decide(run: _Run, in_flight: tuple[int, ...] | None) -> Decided | None:
    """The rule's decision on the queue when it applies (`Queue.decide`), a round boundary's state stored first."""
    if (started := run.applier.start_round(run.queue.newest_round())) is not None:
        run.job.aggregator.put(started)  # the algorithm's round state, which learners read with their next claim
    return run.queue.decide(run.applier.aggregation, run.applier.version, in_flight)


def _apply(run: _Run, decided: Decided) -> None:
    """Apply, then publish and ack in one atomic step, which returns the work left and the gradients landed meanwhile
    (no look, no read of their own); a payload that cannot be applied is dead-lettered instead (the rule decides
    again)."""
    if isinstance(update := run.applier.apply(decided, run.queue.entries), Poisoned):
        return _read(run, Landed([], [(update.gradient_id, update.reason)]))
    fault_point("parameter:before_publish")
    published = run.job.policies.publish_and_ack(
        run.lease,
        expected_version=run.applier.version,
        weights=update.weights,
        optimizer_state=update.optimizer_state,
        gradient_ids=update.ids,
        aggregator=update.state.to_fields(),
        record=update.row.to_fields(),
        applied_maxlen=run.job.limits.applied_maxlen,
        read_after=run.feed.after,
        read_count=run.feed.count,
    )
    fault_point("parameter:after_publish")
    run.applier.published(update, published.version)
    run.queue.remove(update.ids)
    run.work = published.work
    _read(run, run.feed.take(published.landed, held=run.applier.version))
    run.decisions.append(DecisionRow(update.record.decision.value, update.record.count, run.applier.version))
