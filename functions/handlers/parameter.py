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

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import msgpack
import redis

from cache import CodecError, FencingError, GradientMeta, JobCache, LeaseUnavailable, RecordError
from cache.policy_store import UpdateLease
from cache.streams import Entry
from functions.algos.config import PPOConfig
from functions.algos.ppo import adaptive_kl_coef
from functions.algos.staleness import (
    AggregationRule,
    AggregationState,
    Decision,
    DecisionRecord,
    QueueSnapshot,
    decide,
    gradient_scales,
    observe,
    optimizer_step_gradients,
)
from functions.context import Context
from functions.faults import fault_point
from functions.handlers import Stopwatch, job_id_of
from functions.jobspec import JobRequest, JobSpec, resolve, save_spec
from functions.learn import OBS_MOMENTS
from functions.serialize import (
    build_optimizer,
    load_optimizer_bytes,
    load_policy_bytes,
    optimizer_to_bytes,
    policy_to_bytes,
)
from functions.warm import new_policy, spec_of

# Longest blocking read between two looks at in-flight work (dead letters change it without a gradient landing).
BLOCK_S = 1.0
READ_COUNT = 256
DECISIONS_KEPT = 256  # the newest applied decisions returned to the caller (the applied log has them all)


def _start_round(spec: JobSpec, fields: dict[str, float], new_round: int, version: int) -> None:
    """Round boundary: adapt the KL coefficient (PPO) and refresh the target network (IMPACT)."""
    cfg = spec.algo
    if isinstance(cfg, PPOConfig) and cfg.kl_coef > 0 and fields.get("kl_n", 0) > 0:
        observed = fields["kl_sum"] / fields["kl_n"]
        fields["kl_coef"] = adaptive_kl_coef(fields.get("kl_coef", cfg.kl_coef), observed, target=cfg.kl_target)
    fields["kl_sum"] = fields["kl_n"] = 0.0
    if not isinstance(cfg, PPOConfig):
        last = fields.get("target_round", 0.0)
        if new_round - last >= cfg.target_update_frequency:
            fields["target_version"], fields["target_round"] = float(version), float(new_round)
    fields["round_k"] = float(new_round)


def _gradient_part(tensors: Any) -> dict[str, Any]:
    return {k: v for k, v in tensors.items() if k not in OBS_MOMENTS}


def _fold_obs_moments(policy: Any, records: list[Any]) -> None:
    if policy.obs_normalizer is None:
        return
    for t in records:
        if "_obs_mean" in t:
            policy.obs_normalizer.update_from_moments(t["_obs_mean"], t["_obs_var"], float(t["_obs_count"]))


def _warm_key(job: JobCache, optimizer_name: str) -> str:
    return f"param-model:{job.keys.job}:{optimizer_name}"


def _warm_model(ctx: Context, job: JobCache, spec: JobSpec, optimizer_name: str) -> tuple[int, Any, Any]:
    """(version, policy, optimizer) as the store has them: this instance's own from its last invocation when the
    store's version is still the one it published (one update lease at a time, so usually), else loaded. The memo
    entry is taken out while an invocation mutates them and put back when it ends."""
    warm = ctx.memo.pop(_warm_key(job, optimizer_name), None)
    current = job.policies.version()
    if warm is not None and warm[0] == current:
        return warm
    version, blob = job.policies.latest()
    policy = warm[1] if warm is not None else new_policy(ctx, spec)
    load_policy_bytes(policy, blob)
    optimizer = build_optimizer(optimizer_name, list(policy.parameters()), lr=spec.algo.lr)
    load_optimizer_bytes(optimizer, job.policies.optimizer_state() or b"")
    return version, policy, optimizer


def _initialise(job: JobCache, request: Any, ctx: Context) -> dict[str, Any]:
    """Create the job: resolve a JobRequest (when given) into the stored spec, then publish version 0, the seeded
    initial policy. Both are no-ops for what the job already has (a resumed job keeps its policy)."""
    import torch

    if isinstance(request, dict):
        spec = resolve(JobRequest.model_validate({**request, "job": job.keys.job}))
        if job.spec() is None:
            save_spec(job, spec)
        ctx.memo.pop(f"spec:{job.keys.job}", None)
    spec = spec_of(ctx, job)
    torch.manual_seed(spec.seed)
    policy = new_policy(ctx, spec)
    version = job.policies.initialise(policy_to_bytes(policy, version=0))
    # Warm now, not in round 1: the first optimizer a process builds imports torch's compiler stack (~2 s here).
    ctx.memo[_warm_key(job, "adam")] = _warm_model(ctx, job, spec, "adam")
    return {"status": "ok", "version": version, "spec": spec.model_dump(mode="json")}


@contextlib.contextmanager
def _kept(job: JobCache, lease: UpdateLease, lease_s: float) -> Iterator[threading.Event]:
    """Refresh the update lease a third of its length apart until the block ends, then release it. The event is
    set when a refresh finds the lease lost (a publish would then be refused anyway)."""
    stop, lost = threading.Event(), threading.Event()

    def beat() -> None:
        while not stop.wait(lease_s / 3):
            with contextlib.suppress(redis.RedisError):
                if not job.policies.refresh(lease, lease_s=lease_s):
                    lost.set()
                    return

    thread = threading.Thread(target=beat, name="update-lease", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(redis.RedisError):
            job.policies.release(lease)


class _Server:
    """The serving loop's state: the policy and optimizer, the aggregator's fields, and the queued gradients: each
    entry is read once, when it lands; decisions use its metadata, and its arrays are decoded only to aggregate."""

    def __init__(
        self, ctx: Context, job: JobCache, spec: JobSpec, lease: UpdateLease, optimizer_name: str, until_round: int
    ) -> None:
        self.ctx, self.job, self.spec, self.lease, self.until_round = ctx, job, spec, lease, until_round
        self.rule: AggregationRule = spec.algo.stellaris.aggregation_rule()
        self.version, self.policy, self.optimizer = _warm_model(ctx, job, spec, optimizer_name)
        raw = job.client.hgetall(job.keys.aggregator)
        self.fields: dict[str, float] = {k.decode(): float(v) for k, v in raw.items()}
        self.fields.setdefault("round_k", 1.0)
        self.queue: dict[str, GradientMeta] = {}  # arrival order
        self.entries: dict[str, Entry] = {}  # their payloads, as read
        self.last_id = "0-0"
        last_control = job.client.xrevrange(job.keys.control, count=1)
        self.control_id = last_control[0][0].decode() if last_control else "0-0"
        self.compute, self.waited = Stopwatch(), Stopwatch()
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.stop = False
        self.unsaved = 0  # updates since the optimizer state was last stored

    # -- reading ----------------------------------------------------------------------------------------------
    def take(self, entries: list[Entry]) -> None:
        for e in entries:
            self.last_id = e.id
            try:
                self.queue[e.id] = self.job.gradients.meta(e)
                self.entries[e.id] = e
            except (CodecError, RecordError) as exc:
                self._dead_letter(e.id, f"{type(exc).__name__}: {exc}")

    def _dead_letter(self, gradient_id: str, reason: str) -> None:
        self.ctx.log.warning("dead-lettering gradient %s: %s", gradient_id, reason)
        k, lim = self.job.keys, self.job.limits
        with self.job.client.pipeline(transaction=True) as pipe:
            pipe.xadd(
                k.dead_letters,
                {"kind": "gradient", "id": gradient_id, "reason": reason[:1000]},
                maxlen=lim.dead_letter_maxlen,
                approximate=True,
            )
            pipe.xdel(k.grad, gradient_id)
            pipe.execute()
        self.queue.pop(gradient_id, None)
        self.entries.pop(gradient_id, None)

    def wait(self, block_s: float) -> None:
        """Block until gradients land or a control event arrives (stop, dead letter), up to `block_s`."""
        k = self.job.keys
        block_ms = max(1, int(block_s * 1000))
        reply = self.job.client.xread(
            {k.grad: self.last_id, k.control: self.control_id}, count=READ_COUNT, block=block_ms
        )
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
        with self.job.client.pipeline(transaction=True) as pipe:  # one consistent snapshot
            pipe.xlen(self.job.keys.tasks)
            self.job.learners.in_flight_on(pipe)
            pipe.get(self.job.keys.tasks_closed)
            pipe.xlen(self.job.keys.grad)
            tasks, flat, closed, gradients = pipe.execute()
        if gradients > len(self.queue):
            # Landed before the snapshot but not read yet: read them now, or a rule would see their tasks in
            # neither the queue nor in flight (those landing after it are counted twice: a harmless deferral).
            self.take(self.job.gradients.read(self.last_id, count=READ_COUNT))
        held = sorted(int(flat[i + 1]) for i in range(0, len(flat), 2))[:tasks]
        idle = tasks == 0 and gradients == 0 and int(closed or 0) >= self.until_round
        return (*held, *([self.version] * (tasks - len(held)))), idle

    def step(self, sync_expected: int | None) -> tuple[bool, bool]:
        """Decide once; apply when the rule says so. Returns (published, nothing left to do)."""
        in_flight, idle = self.look()
        queued = list(self.queue.items())
        round_now = int(self.fields["round_k"])
        newest = max((m.round for _, m in queued), default=round_now)
        if newest > round_now:
            _start_round(self.spec, self.fields, newest, self.version)
            round_now = newest
            self.job.client.hset(self.job.keys.aggregator, mapping=self.fields)  # learners read kl_coef, target
        delta_max = self.fields.get("delta_max")
        state = AggregationState(round_k=round_now, delta_max=None if delta_max is None else int(delta_max))
        snapshot = QueueSnapshot(self.version, tuple(m.base_version for _, m in queued), in_flight)
        record = decide(self.rule, state, snapshot, sync_expected=sync_expected)
        if not record.applies:
            return False, idle
        self.apply(queued[: record.count], record, state)
        return True, False

    def apply(self, used: list[tuple[str, GradientMeta]], record: DecisionRecord, state: AggregationState) -> None:
        ids = [gid for gid, _ in used]
        records = []
        for gid in ids:
            try:
                records.append(self.job.gradients.record(self.entries[gid]))
            except (CodecError, RecordError) as exc:
                self._dead_letter(gid, f"payload unreadable: {type(exc).__name__}: {exc}")
                return  # decide again without it
        with self.compute:
            scales = gradient_scales(self.rule, record.stalenesses[: record.count])
            parts = [_gradient_part(r.tensors) for r in records]
            for grads in optimizer_step_gradients(parts, scales, self.spec.algo.stellaris.optimizer_steps):
                for name, p in self.policy.named_parameters():
                    p.grad = grads[name].clone()
                self.optimizer.step()
            _fold_obs_moments(self.policy, [r.tensors for r in records])

        state = observe(state, record)
        fields = dict(self.fields)
        if state.delta_max is not None:
            fields["delta_max"] = float(state.delta_max)
        fields["aggregations"] = fields.get("aggregations", 0.0) + 1
        if record.decision is Decision.FLUSH:
            fields["flushes"] = fields.get("flushes", 0.0) + 1
        kls = [float(m.stats["approx_kl"]) for _, m in used if "approx_kl" in m.stats]
        fields["kl_sum"] = fields.get("kl_sum", 0.0) + sum(kls)
        fields["kl_n"] = fields.get("kl_n", 0.0) + len(kls)
        gradients = [
            [gid, m.task_id, m.round, m.base_version, delta]
            for (gid, m), delta in zip(used, record.stalenesses, strict=False)
        ]
        applied = {
            "decision": record.decision.value,
            "round": record.round_k,
            "threshold": "" if record.threshold is None else record.threshold,
            "gradients": msgpack.packb(gradients),
        }
        # The optimizer state (twice the weights for Adam) goes with every N-th publish and at the end of the
        # invocation, not with each: a replacement after a crash resumes with weights exact and moments up to N-1
        # updates old; a warm instance keeps its own in memory.
        self.unsaved += 1
        save = self.unsaved >= self.job.limits.optimizer_save_every
        fault_point("parameter:before_publish")
        self.version = self.job.policies.publish_and_ack(
            self.lease,
            expected_version=self.version,
            weights=policy_to_bytes(self.policy, version=self.version + 1),
            optimizer_state=optimizer_to_bytes(self.optimizer) if save else b"",
            gradient_ids=ids,
            aggregator=fields,
            record=applied,
            applied_maxlen=self.job.limits.applied_maxlen,
        )
        fault_point("parameter:after_publish")
        self.unsaved = 0 if save else self.unsaved
        self.fields = fields
        for gid in ids:
            del self.queue[gid], self.entries[gid]
        self.decisions.append({"decision": record.decision.value, "count": record.count, "version": self.version})


def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Apply the job's gradients as they land until nothing is queued or in flight and round `round` (when given)
    is closed, or until a stop event or `max_s`. `init` creates the job instead."""
    job = ctx.job(job_id_of(event))
    if event.get("init"):
        return _initialise(job, event["init"], ctx)
    spec = spec_of(ctx, job)
    trips0 = ctx.instance.cache.round_trips
    deadline = time.monotonic() + float(event.get("max_s", 3000.0))
    until_round = int(event.get("round") or 0)
    sync_expected = event.get("sync_expected")
    lease_s = job.limits.parameter_lease_s
    try:
        # A dead holder's lease runs out within lease_s: wait a little longer than that by default.
        lease = job.policies.acquire(
            f"param-{ctx.call_id}", lease_s=lease_s, wait_s=float(event.get("wait_s", 2 * lease_s + 1))
        )
    except LeaseUnavailable:
        return {"status": "busy", "decisions": []}
    status = "ok"
    with _kept(job, lease, lease_s) as lost:
        optimizer_name = str(event.get("optimizer", "adam"))
        server = _Server(ctx, job, spec, lease, optimizer_name, until_round)
        server.take(job.gradients.read("0-0", count=job.limits.gradient_maxlen))  # what a predecessor left
        try:
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
                    server.wait(min(BLOCK_S, remaining))
        except FencingError:
            status = "fenced"  # our lease ran out and another holder took over: it carries on from the cache
        if lost.is_set():
            status = "fenced"
        if status != "fenced" and server.unsaved:
            try:
                job.policies.save_optimizer(
                    lease, version=server.version, optimizer_state=optimizer_to_bytes(server.optimizer)
                )
                server.unsaved = 0
            except FencingError:
                status = "fenced"
        if status != "fenced":
            ctx.memo[_warm_key(job, optimizer_name)] = (server.version, server.policy, server.optimizer)
    return {
        "status": status,
        "version": server.version,
        "decisions": list(server.decisions),
        "compute_s": server.compute.seconds,
        "wait_s": server.waited.seconds,
        "redis_round_trips": ctx.instance.cache.round_trips - trips0,
    }
