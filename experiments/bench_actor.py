"""Actor sampling: env steps/s of the platform's actor function (the handler as a serverful actor calls it: policy
from the cache, rollout with reward scaling and episode tracking, the batch encoded and pushed to a real Redis)
vs a bare gymnasium loop stepping the same env with the same policy, one thread, in the same process. Both sample
through the policy's fast path (`ActorCritic.sampler`, what `collect` uses), so the ratio is the platform's
overhead, not a difference in how actions are drawn.

    python -m experiments.bench_actor --env Hopper-v5
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gymnasium as gym
import torch
import typer

from cache import Cache, JobCache
from cache import connect as connect_cache
from contract.jobspec import JobRequest, resolve, resolve_algo
from functions.actor.rollout import _env_action
from functions.handlers import actor, parameter
from functions.model.policies import ActorCritic
from functions.runtime.context import Context, Instance
from functions.runtime.jobspec import save_spec


@dataclass
class ActorBench:
    env_id: str
    platform_steps_per_s: float
    bare_steps_per_s: float
    pair_ratios: list[float]  # platform / bare steps/s of each interleaved pair, wall clock
    cpu_pair_ratios: list[float]  # the same by this process's CPU time (Redis's own CPU for the push not counted)

    @property
    def ratio(self) -> float:
        """The median of the pairs' ratios: each pair ran back to back, so load on a shared machine cancels."""
        return statistics.median(self.pair_ratios)

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.cpu_pair_ratios)


@dataclass
class _Elapsed:
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time: what other work on a shared machine barely moves

    @contextmanager
    def timing(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall_s += time.perf_counter() - wall
        self.cpu_s += time.process_time() - cpu


def _bare_rate(env_id: str, policy: ActorCritic, steps: int) -> tuple[float, float]:
    """The plain loop: gymnasium env, the policy's sampling pass per step, reset on episode end; nothing stored.
    Steps/s by wall clock and by CPU time."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=0)
    elapsed = _Elapsed()
    with elapsed.timing():
        sample = policy.sampler()
        for _ in range(steps):
            action, _, _ = sample(torch.as_tensor(obs[None]))
            obs, _, term, trunc, _ = env.step(_env_action(action, env.action_space)[0])
            if term or trunc:
                obs, _ = env.reset()
    env.close()
    return steps / elapsed.wall_s, steps / elapsed.cpu_s


def measure(cache: Cache, env_id: str = "Hopper-v5", batches: int = 1, repeats: int = 12) -> ActorBench:
    torch.set_num_threads(1)
    job_id = f"bench-actor-{uuid.uuid4().hex[:8]}"
    spec = resolve(JobRequest(job=job_id, env_id=env_id, algo=resolve_algo("ppo", "fast", env_id)))
    job = JobCache(cache.client, job_id)
    instance = Instance(cache)
    save_spec(job, spec)

    def call(handler, event):  # type: ignore[no-untyped-def]
        return handler(event, Context(uuid.uuid4().hex[:12], instance))

    try:
        call(parameter.handle, {"job": job_id, "init": True})
        event = {"job": job_id, "actor_id": "actor-0", "actor_index": 0}

        def platform_rate() -> tuple[float, float]:
            elapsed = _Elapsed()
            for _ in range(batches):
                with elapsed.timing():
                    out = call(actor.handle, event)
                job.trajectories.take("bench", count=1, block_s=1.0)  # the learner side, outside the timing
                job.trajectories.ack([out["batch_id"]])
            steps = batches * spec.actor_steps * spec.num_envs
            return steps / elapsed.wall_s, steps / elapsed.cpu_s

        platform_rate()  # warm: env vector and policy built, like a warm instance
        state = instance.memo.actors[(job_id, "actor-0")]
        plat, bare = [], []
        for _ in range(repeats):  # A B A B in short pairs, so drift in machine load hits both alike
            plat.append(platform_rate())
            bare.append(_bare_rate(env_id, state.policy, batches * spec.actor_steps))
        return ActorBench(
            env_id,
            statistics.median(p for p, _ in plat),
            statistics.median(b for b, _ in bare),
            [p / b for (p, _), (b, _) in zip(plat, bare, strict=True)],
            [p / b for (_, p), (_, b) in zip(plat, bare, strict=True)],
        )
    finally:
        job.delete()


def main(env: str = "Hopper-v5", batches: int = 1, repeats: int = 12) -> None:
    with connect_cache() as cache:
        r = measure(cache, env, batches, repeats)
    print(
        f"{r.env_id}: actor function {r.platform_steps_per_s:,.0f} env steps/s, bare gymnasium loop "
        f"{r.bare_steps_per_s:,.0f} env steps/s, ratio {r.ratio:.3f}x "
        f"(median of {len(r.pair_ratios)} A/B pairs, range {min(r.pair_ratios):.3f}–{max(r.pair_ratios):.3f}x); "
        f"by CPU time {r.cpu_ratio:.2f}x (range {min(r.cpu_pair_ratios):.2f}–{max(r.cpu_pair_ratios):.2f}x)"
    )


if __name__ == "__main__":
    typer.run(main)
