"""The parameter function's setup around its serving loop: creating a job (`init`), the warm policy and optimizer
it resumes from and keeps for the instance's next invocation, and the update lease kept alive while it serves. The
apply step is `functions.parameter.aggregation`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import redis

from cache import JobCache
from cache.policy_store import UpdateLease
from contract import InitResult
from contract.jobspec import JobRequest, JobSpec, resolve
from functions.model.flat_params import flat_params
from functions.model.serialize import build_optimizer, load_optimizer_bytes, load_policy_bytes, policy_to_bytes
from functions.model.warm import new_policy, spec_of
from functions.runtime.context import Context, WarmModel
from functions.runtime.jobspec import save_spec


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
