"""Parameter function: a long-lived invocation that consumes gradients as they land (a blocking read on the
gradient stream), decides by the job's aggregation rule from the gradients' base versions alone, and applies one
optimizer step per aggregation. Each payload is decoded once, when it is aggregated.

Exactly one update at a time: the invocation holds the job's update lease (a fencing token checked inside Redis)
and refreshes it while it lives; a replacement takes over once a dead holder's lease runs out and resumes from the
cache (policy, optimizer state, aggregator state, the gradients still queued). Publishing a version, deleting the
gradients that went into it, storing the aggregator's state and logging the aggregation are one atomic step, so a
crash anywhere applies every gradient exactly once.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Literal

from cache import CodecError, FencingError, GradientMeta, JobCache, LeaseUnavailable, RecordError
from cache.learner_registry import WorkSnapshot
from cache.policy_store import UpdateLease
from cache.streams import Entry
from contract import AggregatorState, DecisionRow, ParameterResult
from contract.triggers import ParameterTrigger
from functions.algos.registry import algorithm_of
from functions.algos.staleness import (
    AggregationRule,
    AggregationState,
    Decision,
    DecisionRecord,
    QueueSnapshot,
    applies_from_queue_alone,
    decide,
    observe,
)
from functions.handlers import Stopwatch, job_id_of, quiet_on_job_loss
from functions.model.serialize import optimizer_to_bytes, policy_to_bytes
from functions.model.warm import spec_of
from functions.parameter.setup import applied_row, fitted, initialise, keep_warm, kept, update, warm_model
from functions.runtime.context import Context
from functions.runtime.faults import fault_point
from functions.runtime.jobspec import JobSpec

# Longest blocking read between two looks at in-flight work (dead letters change it without a gradient landing).
BLOCK_S = 1.0
READ_COUNT = 256
DECISIONS_KEPT = 256  # the newest applied decisions returned to the caller (the applied log has them all)


class _Server:
    """The serving loop's state: the policy and optimizer, the aggregator's state, and the queued gradients: each
    entry is read once, when it lands; decisions use its metadata, and its arrays are decoded only to aggregate."""

    def __init__(
        self, ctx: Context, job: JobCache, spec: JobSpec, lease: UpdateLease, optimizer_name: str, until_round: int
    ) -> None:
        self.ctx, self.job, self.spec, self.lease, self.until_round = ctx, job, spec, lease, until_round
        self.rule: AggregationRule = spec.algo.stellaris.aggregation_rule()
        self.model = warm_model(ctx, job, spec, optimizer_name)
        self.state: AggregatorState = job.aggregator.get()
        self.queue: dict[str, GradientMeta] = {}  # arrival order
        self.entries: dict[str, Entry] = {}  # their payloads, as read
        self.last_id = "0-0"
        last_control = job.client.xrevrange(job.keys.control, count=1)
        self.control_id = last_control[0][0].decode() if last_control else "0-0"
        self.compute, self.waited = Stopwatch(), Stopwatch()
        self.decisions: deque[DecisionRow] = deque(maxlen=DECISIONS_KEPT)
        self.stop = False
        self.unsaved = 0  # updates since the optimizer state was last stored
        self.trigger, self.owed, self.fired_at = spec.parameter_trigger, 0, -math.inf  # owed: a firing's unapplied
        self.from_queue_alone = applies_from_queue_alone(self.rule) and self.trigger == ParameterTrigger()
        self.after_publish: WorkSnapshot | None = None  # the work as the last publish left it, until looked at

    # -- reading ----------------------------------------------------------------------------------------------
    def take(self, entries: list[Entry]) -> None:
        """Queue each entry by its header; one that cannot be decoded, or whose base version was never published
        (no learner can have held it), is dead-lettered instead."""
        for e in entries:
            self.last_id = e.id
            try:
                self.queue[e.id] = self.job.gradients.meta(e, held=self.version)
                self.entries[e.id] = e
            except (CodecError, RecordError) as exc:
                self._dead_letter(e.id, f"{type(exc).__name__}: {exc}")

    def _dead_letter(self, gradient_id: str, reason: str) -> None:
        self.ctx.log.warning("dead-lettering gradient %s: %s", gradient_id, reason)
        self.job.dead_letters.drop(self.job.keys.grad, gradient_id, reason, kind="gradient")
        self.queue.pop(gradient_id, None)
        self.entries.pop(gradient_id, None)

    def wait(self, block_s: float) -> None:
        """Block until gradients land or a control event arrives (stop, dead letter), up to `block_s`."""
        k, self.after_publish = self.job.keys, None
        streams = {k.grad: self.last_id, k.control: self.control_id}
        reply = self.job.client.xread(streams, count=READ_COUNT, block=max(1, int(block_s * 1000)))
        for stream, items in reply or []:
            if stream.decode() == k.grad:
                self.take([Entry(i.decode(), f) for i, f in items if f])
            else:
                self.control_id = items[-1][0].decode()
                self.stop |= any(f.get(b"event") == b"stop" for _, f in items)

    # -- deciding and applying --------------------------------------------------------------------------------
    def look(self) -> tuple[tuple[int, ...], bool]:
        """Base versions of the tasks not yet turned into gradients, and whether the work is done: the round is
        closed and no task or gradient is left (gradients that landed since the last read count too). A task
        leaves the stream only when its gradient is stored (or it is dead-lettered), so the stream's length counts
        them; tasks not (yet) held by a registered learner will use the current version or a newer one."""
        # Right after a publish, the look it returned stands in for ours: a round trip saved per publish.
        snapshot, self.after_publish = self.after_publish, None
        if snapshot is None:
            snapshot = self.job.learners.work_snapshot()
        tasks, versions, closed, gradients = snapshot
        if gradients > len(self.queue):
            # Landed before the snapshot but not read yet: read them now, or a rule would see their tasks in
            # neither the queue nor in flight (those landing after it are counted twice: a harmless deferral).
            self.take(self.job.gradients.read(self.last_id, count=READ_COUNT))
        held = sorted(versions)[:tasks]
        # Gradients of later rounds (gradients_at_actors: actors run ahead) wait for their round's invocation.
        later = len(self.queue) - len(self.visible())
        idle = tasks == 0 and gradients <= later and closed >= self.until_round
        return (*held, *([self.version] * (tasks - len(held)))), idle

    def visible(self) -> list[tuple[str, GradientMeta]]:
        """The queued gradients this invocation may apply: those of its round and earlier ones (all, without a
        round). A run of N rounds thus applies the gradients of rounds 1..N, whatever its actors computed ahead."""
        return [(gid, m) for gid, m in self.queue.items() if not self.until_round or m.round <= self.until_round]

    @property
    def since(self) -> float:
        return time.monotonic() - self.fired_at

    @property
    def version(self) -> int:
        return self.model.version

    def step(self, sync_expected: int | None) -> tuple[bool, bool]:
        """Decide once; apply when the rule says so. Returns (published, nothing left to do). A rule that applies from
        the queue alone (the default trigger) skips the look at work in flight when it applies: a round trip saved."""
        if self.from_queue_alone and self.visible() and self.decide_and_apply(None, sync_expected):
            return True, False
        in_flight, idle = self.look()
        if self.decide_and_apply(in_flight, sync_expected):
            return True, False
        return False, idle

    def decide_and_apply(self, in_flight: tuple[int, ...] | None, sync_expected: int | None) -> bool:
        """Decide on the queue; apply when the rule says so. `in_flight` None: not looked at (unknown, at least
        one), and only a decision to apply is acted on: the rule takes it whatever is in flight."""
        queued = self.visible()
        newest = max((m.round for _, m in queued), default=self.state.round_k)
        if newest > self.state.round_k:
            # Round boundary: the algorithm acts on the state (PPO's KL coefficient, the target network), which
            # learners read with their next claim.
            cfg = self.spec.algo
            self.state = algorithm_of(cfg).start_round(self.state, cfg, new_round=newest, version=self.version)
            self.job.aggregator.put(self.state)
        state = AggregationState(round_k=self.state.round_k, delta_max=self.state.delta_max)
        versions = tuple(m.base_version for _, m in queued)
        if in_flight is None:
            seen, snapshot = len(queued), QueueSnapshot(self.version, versions, (self.version,))
        else:
            # The job's trigger shows the rule whole groups of K (docs/workflows.md); the rest wait,
            # as if in flight. The default shows it the whole queue.
            seen = self.trigger.visible(
                queued=len(queued), in_flight=len(in_flight), owed=self.owed, since_fire_s=self.since
            )
            self.fired_at = time.monotonic() if seen > self.owed else self.fired_at
            snapshot = QueueSnapshot(self.version, versions[:seen], in_flight + versions[seen:])
        record = decide(self.rule, state, snapshot, sync_expected=sync_expected)
        if in_flight is None and not record.applies:
            return False
        self.owed = seen - record.count if record.applies else seen
        if record.applies:
            self.apply(queued[: record.count], record, state)
        return record.applies

    def apply(self, used: list[tuple[str, GradientMeta]], record: DecisionRecord, state: AggregationState) -> None:
        ids = [gid for gid, _ in used]
        records = []
        for gid in ids:
            try:
                records.append(fitted(self.model, self.job.gradients.record(self.entries[gid])))
            except (CodecError, RecordError) as exc:
                self._dead_letter(gid, f"payload unusable: {type(exc).__name__}: {exc}")
                return  # decide again without it
        model = self.model
        with self.compute:
            update(model, self.spec.algo, self.rule, record, records, self.ctx.device)

        observed = observe(state, record)
        kls = [float(m.stats["approx_kl"]) for _, m in used if "approx_kl" in m.stats]
        after = self.state.with_(
            delta_max=observed.delta_max,
            aggregations=self.state.aggregations + 1,
            flushes=self.state.flushes + (record.decision is Decision.FLUSH),
            kl_sum=self.state.kl_sum + sum(kls),
            kl_n=self.state.kl_n + len(kls),
        )
        applied = applied_row(model.version + 1, record, used)
        # The optimizer state (twice the weights for Adam) goes with every N-th publish and at the end of the
        # invocation, not with each: a replacement after a crash resumes with weights exact and moments up to N-1
        # updates old; a warm instance keeps its own in memory.
        self.unsaved += 1
        save = self.unsaved >= self.job.limits.optimizer_save_every
        fault_point("parameter:before_publish")
        published = self.job.policies.publish_and_ack(
            self.lease,
            expected_version=model.version,
            weights=policy_to_bytes(model.policy, version=model.version + 1),
            optimizer_state=optimizer_to_bytes(model.optimizer) if save else b"",
            gradient_ids=ids,
            aggregator=after.to_fields(),
            record=applied.to_fields(),
            applied_maxlen=self.job.limits.applied_maxlen,
            read_after=self.last_id,
            read_count=READ_COUNT,
        )
        model.version, self.after_publish = published.version, published.work
        fault_point("parameter:after_publish")
        self.unsaved = 0 if save else self.unsaved
        self.state = after
        for gid in ids:
            del self.queue[gid], self.entries[gid]
        self.take(published.landed)  # what landed meanwhile came with the publish: no read of its own
        self.decisions.append(DecisionRow(record.decision.value, record.count, model.version))


@quiet_on_job_loss
def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Apply the job's gradients as they land until nothing is queued or in flight and round `round` (when given)
    is closed, or until a stop event or `max_s`. With `round`, gradients of later rounds are left queued for their
    own round's invocation. `init` creates the job instead."""
    job = ctx.job(job_id_of(event))
    device = ctx.device  # a bad STELLARIS_DEVICE fails the call here
    if event.get("init"):
        return initialise(job, event["init"], ctx).to_dict()
    spec = spec_of(ctx, job)
    trips0 = ctx.instance.cache.round_trips
    deadline = time.monotonic() + float(event.get("max_s", 3000.0))
    until_round = int(event.get("round") or 0)
    sync_expected = event.get("sync_expected")
    lease_s = job.limits.parameter_lease_s
    try:
        # A dead holder's lease runs out within lease_s (or is freed sooner when the control plane, which names
        # each invocation's `owner`, learns its instance is gone): wait a little longer than that by default.
        owner = str(event.get("owner") or f"param-{ctx.call_id}")
        lease = job.policies.acquire(owner, lease_s=lease_s, wait_s=float(event.get("wait_s", 2 * lease_s + 1)))
    except LeaseUnavailable:
        return ParameterResult(status="busy", device=str(device)).to_dict()
    status: Literal["ok", "fenced", "expired"] = "ok"
    with kept(job, lease, lease_s) as lost:
        optimizer_name = str(event.get("optimizer", "adam"))
        server = _Server(ctx, job, spec, lease, optimizer_name, until_round)
        try:
            server.take(job.gradients.read("0-0", count=job.limits.gradient_maxlen))  # what a predecessor left
            while not server.stop and not lost.is_set():
                published, idle = server.step(sync_expected)
                if published:
                    continue
                if idle:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status = "expired"
                    break
                with server.waited:
                    server.wait(min(BLOCK_S, remaining, server.trigger.wait_s(server.since) or BLOCK_S))
        except FencingError:
            status = "fenced"  # our lease ran out and another holder took over: it carries on from the cache
        if lost.is_set():
            status = "fenced"
        if status != "fenced" and server.unsaved:
            try:
                job.policies.save_optimizer(
                    lease, version=server.version, optimizer_state=optimizer_to_bytes(server.model.optimizer)
                )
                server.unsaved = 0
            except FencingError:
                status = "fenced"
        if status != "fenced":
            keep_warm(ctx, job, optimizer_name, server.model)
    return ParameterResult(
        status=status,
        version=server.version,
        decisions=list(server.decisions),
        compute_s=server.compute.seconds,
        wait_s=server.waited.seconds,
        redis_round_trips=ctx.instance.cache.round_trips - trips0,
        device=str(device),
    ).to_dict()
