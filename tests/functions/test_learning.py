"""Learning through the three handlers, driven by a plain loop (no gateway): returns must clearly rise.

Learners run as separate processes pulling tasks from the cache; the test process plays actor and parameter
function. Each run stops as soon as the mean of the last 10 training episodes reaches the threshold.
"""

from __future__ import annotations

import time

import pytest
import torch

from cache import Cache
from contract.algo_config import AlgoConfig, APPOConfig, IMPACTConfig, NetworkConfig, PPOConfig, Rule, StellarisConfig
from contract.jobspec import JobSpec
from tests.functions.driver import Driver
from tests.functions.test_pipeline import spawn, stop

THRESHOLD = 400.0
MAX_ROUNDS = 500


def learn(cache: Cache, spec: JobSpec, *, mode: str, learners: int) -> tuple[int, list[float]]:
    """Rounds until the mean of the last 10 episodes reaches THRESHOLD; returns (rounds, curve every 5 rounds)."""
    torch.set_num_threads(1)
    driver = Driver(cache, spec)
    procs = spawn("learner", cache.url, spec.job, learners)
    curve: list[float] = []
    start = time.monotonic()
    try:
        for r in range(1, MAX_ROUNDS + 1):
            driver.run_round(mode=mode, learn_inline=False)
            recent = driver.returns[-10:]
            mean = sum(recent) / max(len(recent), 1)
            if r % 5 == 0:
                curve.append(round(mean, 1))
            if len(driver.returns) >= 10 and mean >= THRESHOLD:
                print(
                    f"{spec.job}: mean return {mean:.0f} after {r} rounds, {time.monotonic() - start:.1f} s; "
                    f"curve every 5 rounds: {curve}"
                )
                return r, curve
    finally:
        stop(driver.job, procs)
        driver.job.delete()
    pytest.fail(f"{spec.job}: no mean return >= {THRESHOLD} in {MAX_ROUNDS} rounds; curve: {curve}")


def cartpole(job: str, cfg: AlgoConfig) -> JobSpec:
    return JobSpec(job=job, env_id="CartPole-v1", algo=cfg, num_envs=4, actor_steps=128, seed=1)


def ppo(rule: Rule) -> PPOConfig:
    return PPOConfig(
        lr=2.5e-3,
        train_batch_size=512,
        num_minibatches=4,
        num_epochs=4,
        clip=0.2,
        kl_coef=0.0,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        network=NetworkConfig(kind="mlp", hidden=(64, 64)),
        stellaris=StellarisConfig(rule=rule),
    )


@pytest.mark.slow
def test_ppo_stellaris_with_two_learners_learns_cartpole(cache_conn: Cache, job_id: str) -> None:
    rounds, _ = learn(cache_conn, cartpole(job_id, ppo(Rule.STELLARIS)), mode="stellaris", learners=2)
    assert rounds <= MAX_ROUNDS


@pytest.mark.slow
def test_ppo_sync_learns_cartpole(cache_conn: Cache, job_id: str) -> None:
    rounds, _ = learn(cache_conn, cartpole(job_id, ppo(Rule.SYNC)), mode="sync", learners=2)
    assert rounds <= MAX_ROUNDS


@pytest.mark.slow
def test_impact_stellaris_learns_cartpole(cache_conn: Cache, job_id: str) -> None:
    cfg = IMPACTConfig(
        lr=2.5e-3,
        train_batch_size=512,
        num_minibatches=4,
        num_epochs=2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        network=NetworkConfig(kind="mlp", hidden=(64, 64)),
    )
    rounds, _ = learn(cache_conn, cartpole(job_id, cfg), mode="stellaris", learners=2)
    assert rounds <= MAX_ROUNDS


@pytest.mark.slow
def test_appo_stellaris_learns_cartpole(cache_conn: Cache, job_id: str) -> None:
    """APPO through the algorithm seam: V-trace targets and advantages, PPO's clip on π_θ/μ, two learners."""
    cfg = APPOConfig(
        lr=2.5e-3,
        train_batch_size=512,
        num_minibatches=4,
        num_epochs=2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        network=NetworkConfig(kind="mlp", hidden=(64, 64)),
    )
    rounds, _ = learn(cache_conn, cartpole(job_id, cfg), mode="stellaris", learners=2)
    assert rounds <= MAX_ROUNDS  # a mean return of THRESHOLD, against ~20 for a random policy
