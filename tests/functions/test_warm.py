"""The learner's warm policy cache (`functions.model.warm.policy_at`): an LRU by version whose least recently used
module
is reloaded for a new version, except the modules a computation holds meanwhile (a learner claiming ahead)."""

from __future__ import annotations

import torch

from cache import Cache, JobCache
from contract.algo_config import NetworkConfig, PPOConfig
from contract.jobspec import JobSpec
from functions.model.serialize import policy_to_bytes
from functions.model.warm import MAX_CACHED_POLICIES, new_policy, policy_at
from functions.runtime.context import Context, Instance
from functions.runtime.jobspec import save_spec


def _weights(ctx: Context, spec: JobSpec, version: int) -> bytes:
    policy = new_policy(ctx, spec)
    with torch.no_grad():
        for p in policy.parameters():
            p.fill_(float(version))
    return policy_to_bytes(policy, version=version)


def _filled(policy: torch.nn.Module) -> float:
    return float(next(iter(policy.parameters())).detach().flatten()[0])


def test_a_kept_module_is_never_reloaded_and_the_others_are_reused(cache_conn: Cache, job_id: str) -> None:
    job = JobCache(cache_conn.client, job_id)
    spec = JobSpec(job=job_id, env_id="CartPole-v1", algo=PPOConfig(network=NetworkConfig(kind="mlp", hidden=(8, 8))))
    save_spec(job, spec)
    ctx = Context("test", Instance(cache_conn, jobs={job_id: job}))
    try:
        held = policy_at(ctx, job, spec, 0, _weights(ctx, spec, 0))
        loaded = [
            policy_at(ctx, job, spec, v, _weights(ctx, spec, v), keep=[held]) for v in range(1, 3 * MAX_CACHED_POLICIES)
        ]
        assert _filled(held) == 0.0  # the least recently used all along, and never reloaded
        assert all(p is not held for p in loaded)
        assert len({id(p) for p in loaded}) == MAX_CACHED_POLICIES - 1  # the other modules are reloaded in turn
        assert policy_at(ctx, job, spec, 0) is held  # still cached under its version
        # Without `keep`, the least recently used module is reloaded: no module is built beyond the cache's size.
        fresh = policy_at(ctx, job, spec, 100, _weights(ctx, spec, 100))
        assert _filled(fresh) == 100.0 and fresh is not held
        assert len(ctx.memo.policies[job_id]) == MAX_CACHED_POLICIES
    finally:
        job.delete()
