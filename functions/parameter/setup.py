"""The parameter function's setup around its serving loop: creating a job (`init`), the warm policy and optimizer
it resumes from, the update lease kept alive while it serves, the checks that keep a poisoned gradient out of an
update (`fitted`), and one aggregation's update of the model and its row in the applied log."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import redis
import torch

from cache import GradientMeta, GradientRecord, JobCache, RecordError
from cache.policy_store import UpdateLease
from contract import AppliedGradient, AppliedRow, InitResult
from contract.packed import PACKED
from functions.algos.config import AlgoConfig
from functions.algos.lr_schedule import learning_rate
from functions.algos.staleness import AggregationRule, DecisionRecord, gradient_scales
from functions.algos.staleness_equations import optimizer_step_gradients
from functions.model.device import to_device
from functions.model.flat_params import flat_params
from functions.model.serialize import build_optimizer, load_optimizer_bytes, load_policy_bytes, policy_to_bytes
from functions.model.warm import new_policy, spec_of
from functions.parameter.checks import moments_problem, tensors_problem
from functions.runtime.context import Context, WarmModel
from functions.runtime.jobspec import JobRequest, JobSpec, resolve, save_spec


def warm_model(ctx: Context, job: JobCache, spec: JobSpec, optimizer_name: str) -> WarmModel:
    """(version, policy, optimizer) on the instance's device, as the store has them: this instance's own from its
    last invocation when the store's version is still the one it published (one update lease at a time, so
    usually), else loaded (weights and optimizer state from the wire onto the device). The warm entry is taken out
    while an invocation mutates it and put back (`keep_warm`) when it ends."""
    warm = ctx.memo.models.pop((job.keys.job, optimizer_name), None)
    current = job.policies.version()
    if warm is not None and warm.version == current:
        return warm
    version, blob = job.policies.latest()
    policy = warm.policy if warm is not None else new_policy(ctx, spec, device=ctx.device)
    load_policy_bytes(policy, blob)
    fp = flat_params(policy)
    params = [fp.flat] if fp is not None else list(policy.parameters())
    optimizer = build_optimizer(optimizer_name, params, lr=spec.algo.lr, adam_eps=spec.algo.adam_eps)
    load_optimizer_bytes(optimizer, job.policies.optimizer_state() or b"")
    return WarmModel(version, policy, optimizer)


def fitted(model: WarmModel, record: GradientRecord) -> GradientRecord:
    """`record` with its tensors as the model's optimizer steps them: packed for a packed policy (either way they
    travelled). A gradient that does not fit the policy (other parameter names or shapes, values that are not finite,
    observation moments its normaliser cannot take) raises `RecordError`, naming how: poison, as an unreadable one,
    and nothing is applied."""
    fp = flat_params(model.policy)
    try:
        record = record if fp is None else replace(record, tensors={PACKED: fp.pack(record.tensors)})
    except ValueError as exc:
        raise RecordError(f"gradient {record.meta.task_id!r} from {record.meta.learner_id!r}: {exc}") from exc
    problem = tensors_problem(record.tensors, {name: tuple(p.shape) for name, p in model.named})
    normalizer, m = model.policy.obs_normalizer, record.obs_moments
    if problem is None and m is not None:
        problem = moments_problem(m.mean, m.var, m.count, None if normalizer is None else tuple(normalizer.mean.shape))
    if problem is not None:
        raise RecordError(f"gradient {record.meta.task_id!r} from {record.meta.learner_id!r}: {problem}")
    return record


def update(
    model: WarmModel, cfg: AlgoConfig, rule: AggregationRule, record: DecisionRecord, records: list[GradientRecord],
    device: torch.device,
) -> None:  # fmt: skip
    """One aggregation's update of the model (its `fitted` records): the optimizer steps on the scaled gradients at
    the round's learning rate, then the gradients' observation moments (a round's fresh batches) into the policy's
    normaliser."""
    lr = learning_rate(
        cfg.lr, cfg.lr_schedule, round_k=max(record.round_k, 1), horizon_rounds=rule.horizon_rounds,
        final_fraction=cfg.lr_final_fraction,
    )  # fmt: skip
    for group in model.optimizer.param_groups:
        group["lr"] = lr
    parts = [to_device(r.tensors, device) for r in records]
    scales = gradient_scales(rule, record.stalenesses[: record.count])
    for grads in optimizer_step_gradients(parts, scales, cfg.stellaris.optimizer_steps):
        for name, p in model.named:
            p.grad = grads[name]  # fresh tensors: the step may take them as they are
        model.optimizer.step()
    normalizer = model.policy.obs_normalizer
    for m in (r.obs_moments for r in records):
        if m is not None and normalizer is not None:
            normalizer.update_from_moments(m.mean, m.var, m.count)


def keep_warm(ctx: Context, job: JobCache, optimizer_name: str, model: WarmModel) -> None:
    ctx.memo.models[(job.keys.job, optimizer_name)] = model


def initialise(job: JobCache, request: Any, ctx: Context) -> InitResult:
    """Create the job: resolve a JobRequest (when given) into the stored spec, then publish version 0, the seeded
    initial policy. Both are no-ops for what the job already has (a resumed job keeps its policy)."""
    import torch

    if isinstance(request, dict):
        spec = resolve(JobRequest.model_validate({**request, "job": job.keys.job}))
        if job.spec() is None:
            save_spec(job, spec)
        ctx.memo.specs.pop(job.keys.job, None)
    spec = spec_of(ctx, job)
    torch.manual_seed(spec.seed)
    policy = new_policy(ctx, spec)  # on the CPU: the seed gives the same initial weights whatever the device
    version = job.policies.initialise(policy_to_bytes(policy, version=0))
    # Warm now, not in round 1: the first optimizer a process builds imports torch's compiler stack (~2 s here).
    keep_warm(ctx, job, "adam", warm_model(ctx, job, spec, "adam"))
    return InitResult(version=version, spec=spec.model_dump(mode="json"), device=str(ctx.device))


@contextlib.contextmanager
def kept(job: JobCache, lease: UpdateLease, lease_s: float) -> Iterator[threading.Event]:
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


def applied_row(version: int, record: DecisionRecord, used: list[tuple[str, GradientMeta]]) -> AppliedRow:
    """The applied log's row for one aggregation: the version it made and each gradient that went into it."""
    return AppliedRow(
        version=version,
        decision=record.decision.value,
        round=record.round_k,
        threshold=record.threshold,
        gradients=[
            AppliedGradient(gid, m.task_id, m.round, m.base_version, delta)
            for (gid, m), delta in zip(used, record.stalenesses, strict=False)
        ],
    )
