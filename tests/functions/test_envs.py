"""Every environment the issue names runs one round through the three handlers, with the paper's networks."""

import pytest

from cache import Cache
from functions.algos.config import preset
from functions.jobspec import JobSpec
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
