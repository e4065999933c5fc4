"""Parameter function: drain the gradient queue by the job's aggregation rule, one optimizer step per
aggregation, publish version + 1. Stateless between invocations: queue, round, δ_max and optimizer state live in
the cache, and the update lease (a fencing token checked inside Redis) lets one update through at a time."""

from __future__ import annotations

import json
from typing import Any

from cache import JobCache, LeaseUnavailable
from functions.algos.config import PPOConfig
from functions.algos.ppo import adaptive_kl_coef
from functions.algos.staleness import (
    AggregationState,
    Decision,
    DecisionRecord,
    QueueSnapshot,
    aggregate,
    decide,
    gradient_scales,
    observe,
)
from functions.context import Context
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

CONSUMER = "parameter"
DECISIONS_MAXLEN = 100_000


def _load_state(job: JobCache) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in job.client.hgetall(job.keys.aggregator).items()}


def _save_state(job: JobCache, fields: dict[str, float]) -> None:
    with job.client.pipeline(transaction=True) as pipe:
        pipe.hset(job.keys.aggregator, mapping=fields)
        pipe.pexpire(job.keys.aggregator, int(job.limits.ttl_s * 1000))
        pipe.execute()


def _log_decision(job: JobCache, record: DecisionRecord, version: int) -> None:
    fields = {
        "round": record.round_k,
        "decision": record.decision.value,
        "count": record.count,
        "version": version,
        "stalenesses": json.dumps(list(record.stalenesses)),
        "mean": record.mean_staleness,
        "max": record.max_staleness,
        "threshold": "" if record.threshold is None else record.threshold,
    }
    job.client.xadd(job.keys.decisions, fields, maxlen=DECISIONS_MAXLEN, approximate=True)
    job.client.pexpire(job.keys.decisions, int(job.limits.ttl_s * 1000))


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


def _in_flight_versions(job: JobCache, current: int) -> tuple[int, ...]:
    """Base versions of the tasks not yet turned into gradients: a task leaves the stream only when its gradient
    is stored, so the stream's length counts them; tasks not (yet) in the registry will use `current` or newer."""
    tasks = job.tasks.length()
    held = sorted(job.learners.in_flight().values())[:tasks]
    return (*held, *([current] * (tasks - len(held))))


def _warm_key(job: JobCache, optimizer_name: str) -> str:
    return f"param-model:{job.keys.job}:{optimizer_name}"


def _warm_model(ctx: Context, job: JobCache, spec: JobSpec, optimizer_name: str, current: int) -> tuple[Any, Any]:
    """The policy and optimizer at version `current`: this instance's own from its last publish when the store is
    still there (one update lease at a time, so usually), else loaded from the store. The memo entry is taken out
    while the update mutates them and put back only after a successful publish."""
    warm = ctx.memo.pop(_warm_key(job, optimizer_name), None)
    if warm is not None and warm[0] == current:
        return warm[1], warm[2]
    policy = warm[1] if warm is not None else new_policy(ctx, spec)
    _, blob = job.policies.latest()
    load_policy_bytes(policy, blob)
    optimizer = build_optimizer(optimizer_name, list(policy.parameters()), lr=spec.algo.lr)
    load_optimizer_bytes(optimizer, job.policies.optimizer_state() or b"")
    return policy, optimizer


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
    return {"status": "ok", "version": version, "decisions": [], "spec": spec.model_dump(mode="json")}


def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    job = ctx.job(job_id_of(event))
    if event.get("init"):
        return _initialise(job, event["init"], ctx)
    spec = spec_of(ctx, job)
    rule = spec.algo.stellaris.aggregation_rule()
    max_updates = int(event.get("max_updates", 1_000_000))
    optimizer_name = str(event.get("optimizer", "adam"))
    try:
        lease = job.policies.acquire(
            f"param-{ctx.call_id}", lease_s=float(event.get("lease_s", 60.0)), wait_s=float(event.get("wait_s", 0.0))
        )
    except LeaseUnavailable:
        return {"status": "busy", "decisions": []}

    decisions: list[dict[str, Any]] = []
    compute = Stopwatch()  # aggregation and the optimizer step; the rest is cache I/O and (de)serialisation
    try:
        while len([d for d in decisions if d["applied"]]) < max_updates:
            current = job.policies.version()
            assert current is not None
            # In-flight before the queue: a gradient landing in between is then counted twice (a harmless
            # deferral), never zero times (a premature flush).
            in_flight = _in_flight_versions(job, current)
            queue = job.gradients.queued(CONSUMER)
            fields = _load_state(job)
            round_now = int(fields.setdefault("round_k", 1.0))
            newest = max((int(r.stats.get("round", round_now)) for _, r in queue), default=round_now)
            if newest > round_now:
                _start_round(spec, fields, newest, current)
                round_now = newest
            delta_max = fields.get("delta_max")
            state = AggregationState(round_k=round_now, delta_max=None if delta_max is None else int(delta_max))
            snapshot = QueueSnapshot(current, tuple(r.base_version for _, r in queue), in_flight)
            record = decide(rule, state, snapshot, sync_expected=event.get("sync_expected"))
            _log_decision(job, record, current)
            decisions.append(
                {
                    "decision": record.decision.value,
                    "count": record.count,
                    "round": round_now,
                    "stalenesses": list(record.stalenesses),
                    "threshold": record.threshold,
                    "version": current,
                    "applied": record.applies,
                }
            )
            if not record.applies:
                _save_state(job, fields)
                break
            used = queue[: record.count]
            with compute:
                scales = gradient_scales(rule, record.stalenesses[: record.count])
                grads = aggregate([_gradient_part(r.tensors) for _, r in used], scales)

            policy, optimizer = _warm_model(ctx, job, spec, optimizer_name, current)
            with compute:
                for name, p in policy.named_parameters():
                    p.grad = grads[name].clone()
                optimizer.step()
                _fold_obs_moments(policy, [r.tensors for _, r in used])
            job.policies.publish(
                lease,
                expected_version=current,
                weights=policy_to_bytes(policy, version=current + 1),
                optimizer_state=optimizer_to_bytes(optimizer),
            )
            ctx.memo[_warm_key(job, optimizer_name)] = (current + 1, policy, optimizer)  # what the store now holds
            job.gradients.ack([gid for gid, _ in used])

            state = observe(state, record)
            if state.delta_max is not None:
                fields["delta_max"] = float(state.delta_max)
            fields["aggregations"] = fields.get("aggregations", 0.0) + 1
            if record.decision is Decision.FLUSH:
                fields["flushes"] = fields.get("flushes", 0.0) + 1
            kls = [float(r.stats["approx_kl"]) for _, r in used if "approx_kl" in r.stats]
            fields["kl_sum"] = fields.get("kl_sum", 0.0) + sum(kls)
            fields["kl_n"] = fields.get("kl_n", 0.0) + len(kls)
            _save_state(job, fields)
    finally:
        job.policies.release(lease)
    return {"status": "ok", "version": job.policies.version(), "decisions": decisions, "compute_s": compute.seconds}
