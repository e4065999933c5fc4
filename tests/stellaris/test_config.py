"""TrainConfig: what it asks the functions side for, and bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.jobspec import JobRequest, resolve
from stellaris.config import ConfigError, TrainConfig, load_config


def test_actor_policy_refresh_reaches_the_job_spec() -> None:
    cfg = TrainConfig(env="Hopper-v5", preset="fast", rounds=1)
    assert cfg.actor_policy_refresh == 4
    spec = resolve(JobRequest.model_validate(cfg.job_request("j1")))
    assert spec.policy_refresh_steps == 4 and spec.num_envs == 2 and spec.actor_steps == 1024
    off = TrainConfig(env="Hopper-v5", preset="fast", rounds=1, actor_policy_refresh=0)
    assert resolve(JobRequest.model_validate(off.job_request("j2"))).policy_refresh_steps == 0


def test_a_negative_refresh_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("env: Hopper-v5\nactor_policy_refresh: -1\nrounds: 1\n")
    with pytest.raises(ConfigError, match="actor_policy_refresh"):
        load_config(path, {})
