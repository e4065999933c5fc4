"""Per-instance warm state shared by the handlers: job specs, envs and policies kept across invocations."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Collection

import gymnasium as gym
import torch

from cache import JobCache
from contract.jobspec import JobSpec
from functions.actor.envs import make_vector_env
from functions.model.flat_params import flatten_parameters
from functions.model.policies import ActorCritic, build_policy
from functions.model.serialize import load_policy_bytes
from functions.runtime.context import Context
from functions.runtime.jobspec import load_spec

MAX_CACHED_POLICIES = 8


def spec_of(ctx: Context, job: JobCache) -> JobSpec:
    specs = ctx.memo.specs
    if job.keys.job not in specs:
        specs[job.keys.job] = load_spec(job)
    return specs[job.keys.job]


def spaces_of(ctx: Context, spec: JobSpec) -> tuple[gym.Space, gym.Space]:
    spaces = ctx.memo.spaces
    # env_kwargs can change the spaces (an observation size), so they are part of the key.
    key = f"{spec.env_module or ''}|{spec.env_id}|{json.dumps(spec.env_kwargs, sort_keys=True)}"
    if key not in spaces:
        env = make_vector_env(spec.env_id, 1, seed=spec.seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module)
        spaces[key] = (env.single_observation_space, env.single_action_space)
        env.close()
    return spaces[key]


def new_policy(ctx: Context, spec: JobSpec, *, device: torch.device | str = "cpu") -> ActorCritic:
    """A fresh policy for the job's spaces on `device` (actors: always the CPU), its parameters packed in one
    tensor (`functions.model.flat_params`): weights load, publish and travel as one buffer."""
    obs_space, act_space = spaces_of(ctx, spec)
    net = spec.algo.network
    policy = build_policy(
        obs_space,
        act_space,
        hidden=net.hidden,
        kind=net.kind,
        activation=net.activation,
        normalize_obs=spec.algo.normalize_obs,
    ).to(device)
    flatten_parameters(policy)
    return policy


def policy_at(
    ctx: Context,
    job: JobCache,
    spec: JobSpec,
    version: int,
    blob: bytes | None = None,
    *,
    keep: Collection[ActorCritic] = (),
) -> ActorCritic:
    """The policy of `version` on the instance's device (learners), from a small per-instance LRU before the store
    (or from `blob`, its weights when the caller already has them): weights load from the wire onto the device.
    `keep`: modules in use elsewhere meanwhile (a learner claiming ahead computes with them), never reloaded."""
    lru = ctx.memo.policies.setdefault(job.keys.job, OrderedDict())
    if version in lru:
        lru.move_to_end(version)
        return lru[version]
    if blob is None:
        blob = job.policies.get(version)
    # Reuse the least recently used module once the cache is full: building one costs more than loading weights.
    policy = _recycled(lru, keep) if len(lru) >= MAX_CACHED_POLICIES else None
    policy = policy or new_policy(ctx, spec, device=ctx.device)
    load_policy_bytes(policy, blob)
    lru[version] = policy
    return policy


def _recycled(lru: OrderedDict[int, ActorCritic], keep: Collection[ActorCritic]) -> ActorCritic | None:
    """The least recently used module not in `keep`, taken out of `lru` (None when all are kept)."""
    kept = {id(p) for p in keep}
    for version, policy in lru.items():
        if id(policy) not in kept:
            del lru[version]
            return policy
    return None
