"""Actor sampling: env steps/s of the platform's actor function (the handler as a serverful actor calls it: policy
from the cache, rollout with reward scaling and episode tracking, the batch encoded and pushed to a real Redis)
vs a bare gymnasium loop stepping the same env with the same policy, one thread, in the same process.

    python -m experiments.bench_actor --env Hopper-v5
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass

import gymnasium as gym
import torch
import typer

from cache import Cache, JobCache
from cache import connect as connect_cache
from functions.context import Context, Instance
from functions.handlers import actor, parameter
from functions.jobspec import JobRequest, resolve, save_spec
from functions.rollout import _env_action


@dataclass
class ActorBench:
    env_id: str
    platform_steps_per_s: float
    bare_steps_per_s: float

    @property
    def ratio(self) -> float:
        return self.platform_steps_per_s / self.bare_steps_per_s


def _bare_rate(env_id: str, policy: torch.nn.Module, steps: int) -> float:
    """The plain loop: gymnasium env, the policy's forward pass per step, reset on episode end; nothing stored."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(steps):
        action, _, _ = policy.act(torch.as_tensor(obs[None]))
        obs, _, term, trunc, _ = env.step(_env_action(action, env.action_space)[0])
        if term or trunc:
            obs, _ = env.reset()
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def measure(cache: Cache, env_id: str = "Hopper-v5", batches: int = 4, repeats: int = 3) -> ActorBench:
    torch.set_num_threads(1)
    job_id = f"bench-actor-{uuid.uuid4().hex[:8]}"
    spec = resolve(JobRequest(job=job_id, env_id=env_id, preset="fast"))
    job = JobCache(cache.client, job_id)
    instance = Instance(cache)
    save_spec(job, spec)

    def call(handler, event):  # type: ignore[no-untyped-def]
        return handler(event, Context(uuid.uuid4().hex[:12], instance))

    try:
        call(parameter.handle, {"job": job_id, "init": True})
        event = {"job": job_id, "actor_id": "actor-0", "actor_index": 0}

        def platform_rate() -> float:
            seconds = 0.0
            for _ in range(batches):
                t0 = time.perf_counter()
                out = call(actor.handle, event)
                seconds += time.perf_counter() - t0
                job.trajectories.take("bench", count=1, block_s=1.0)  # the learner side, outside the timing
                job.trajectories.ack([out["batch_id"]])
            return batches * spec.actor_steps * spec.num_envs / seconds

        platform_rate()  # warm: env vector and policy built, like a warm instance
        state = instance.memo[f"actor:{job_id}:actor-0"]
        plat, bare = [], []
        for _ in range(repeats):  # interleaved, so drift in machine load hits both alike
            plat.append(platform_rate())
            bare.append(_bare_rate(env_id, state.policy, batches * spec.actor_steps))
        return ActorBench(env_id, statistics.median(plat), statistics.median(bare))
    finally:
        job.delete()


def main(env: str = "Hopper-v5", batches: int = 4, repeats: int = 3) -> None:
    with connect_cache() as cache:
        r = measure(cache, env, batches, repeats)
    print(
        f"{r.env_id}: actor function {r.platform_steps_per_s:,.0f} env steps/s, bare gymnasium loop "
        f"{r.bare_steps_per_s:,.0f} env steps/s, ratio {r.ratio:.2f}x"
    )


if __name__ == "__main__":
    typer.run(main)
