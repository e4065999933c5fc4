"""Every environment the issue names runs one round through the three handlers, with the paper's networks."""

import numpy as np
import pytest

from cache import Cache
from contract.algo_config import preset
from contract.jobspec import JobSpec
from functions.actor.rollout import ClippedRewards
from tests.functions.driver import Driver

ENVS = [
    ("Hopper-v5", "mujoco"),
    ("Walker2d-v5", "mujoco"),
    ("Humanoid-v5", "mujoco"),
    ("ALE/SpaceInvaders-v5", "atari"),
    ("ALE/Qbert-v5", "atari"),
    ("ALE/Gravitar-v5", "atari"),
]


@pytest.mark.parametrize(("env_id", "kind"), ENVS)
@pytest.mark.parametrize("algo", ["ppo", "impact"])
def test_one_round_on_each_named_env(cache_conn: Cache, job_id: str, env_id: str, kind: str, algo: str) -> None:
    num_envs, steps = 2, 16
    cfg = preset("paper", algo, kind).model_copy(update={"train_batch_size": num_envs * steps, "num_epochs": 1})
    spec = JobSpec(job=job_id, env_id=env_id, algo=cfg, num_envs=num_envs, actor_steps=steps)
    driver = Driver(cache_conn, spec)
    try:
        driver.run_round(mode="stellaris")
        assert driver.job.policies.version() >= 1
        policy_blob = driver.job.policies.latest()[1]
        assert len(policy_blob) > 1000
    finally:
        driver.job.delete()


def test_atari_trains_on_clipped_rewards_and_logs_game_scores(cache_conn: Cache, job_id: str) -> None:
    """SpaceInvaders pays 5–30 points per alien: the batch carries sign-clipped rewards (the training signal), the
    episode tracker the game's own points (what info.csv and the figures report)."""
    num_envs, steps = 2, 256
    cfg = preset("paper", "ppo", "atari").model_copy(update={"train_batch_size": num_envs * steps})
    spec = JobSpec(job=job_id, env_id="ALE/SpaceInvaders-v5", algo=cfg, num_envs=num_envs, actor_steps=steps)
    driver = Driver(cache_conn, spec)
    try:
        (batch_id,) = driver.collect()
        batch = driver.job.trajectories.get(batch_id)
        assert batch is not None
        rewards = batch.arrays["rewards"]
        assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0} and rewards.max() == 1.0
        tracker = driver.instance.memo.actors[(job_id, "actor-0")].tracker
        points = sum(batch.info["episode_returns"]) + tracker.returns.sum()  # everything scored since reset
        assert points >= 5 * (rewards == 1.0).sum()  # game points (>= 5 per alien), not clipped counts
    finally:
        driver.job.delete()


def test_clipped_rewards_then_scaler() -> None:
    done = np.array([False, False, False])
    assert ClippedRewards()(np.array([-7.0, 0.0, 25.0]), done).tolist() == [-1.0, 0.0, 1.0]
    scaled = ClippedRewards(then=lambda r, d: 2 * r)(np.array([3.0, -0.5, 0.0]), done)  # type: ignore[arg-type]
    assert scaled.tolist() == [2.0, -2.0, 0.0]
