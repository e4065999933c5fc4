"""The distribution profiles end to end (`stellaris.train`: embedded Redis, local gateway, subprocess instances):
the config field and its errors, and both profiles learning CartPole with every gradient applied exactly once."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import stellaris
from contract.jobspec import JobRequest, resolve
from stellaris.config import ConfigError, TrainConfig, load_config

# test_learning.py's CartPole PPO, run through the product: 512-step rounds of 4 envs, 4 minibatches x 4 epochs.
CARTPOLE = {
    "env": "CartPole-v1",
    "algo": "ppo",
    "preset": "paper",
    "actors": 1,
    "envs_per_actor": 4,
    "learners": 2,
    "seed": 1,
    "total_steps": 40_960,
    "overrides": {
        "lr": 2.5e-3,
        "train_batch_size": 512,
        "num_minibatches": 4,
        "num_epochs": 4,
        "clip": 0.2,
        "kl_coef": 0.0,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "network": {"kind": "mlp", "hidden": [64, 64]},
    },
}
# Learned: some 10 consecutive training episodes average this, 7x a random policy's ~22. test_learning.py's 400 is
# reached by some runs of this budget and missed by others (CI: 248 and 396.4 in 80 rounds; with lr 2.5e-3 a run
# that reached 500 fell back), and its driver stops at the threshold where this run has a fixed budget.
THRESHOLD = 150.0


def test_distribution_defaults_to_trajectories_and_reaches_the_job_spec() -> None:
    assert TrainConfig(rounds=1).distribution == "trajectories"
    cfg = TrainConfig(env="CartPole-v1", rounds=1, distribution="gradients_at_actors")
    request = cfg.job_request("j1")
    assert request.distribution == "gradients_at_actors"
    assert resolve(JobRequest.model_validate(request)).distribution == "gradients_at_actors"


def test_a_bad_distribution_is_an_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="distribution: Input should be 'trajectories' or 'gradients_at_actors'"):
        load_config(None, {"env": "CartPole-v1", "rounds": 1, "distribution": "gradients"})
    path = tmp_path / "run.yaml"
    path.write_text("env: CartPole-v1\nrounds: 1\ndistribution: 3\n")
    with pytest.raises(ConfigError, match=r"^invalid configuration: distribution: "):
        load_config(path, {})
    assert load_config(path, {"distribution": "gradients_at_actors"}).distribution == "gradients_at_actors"


def test_replay_with_gradients_at_actors_is_refused_naming_both() -> None:
    """Replay re-reads trajectory batches, which gradients_at_actors never ships: refused before anything starts."""
    base = {"env": "CartPole-v1", "rounds": 1, "algo": "impact", "overrides": {"replay": "uniform"}}
    with pytest.raises(ConfigError, match="replay 'uniform' needs distribution 'trajectories'"):
        load_config(None, base | {"distribution": "gradients_at_actors"})
    assert load_config(None, base).overrides == {"replay": "uniform"}


def learned(run: Path) -> float:
    """The best mean of 10 consecutive training episodes."""
    returns = [float(r["episodic_reward"]) for r in csv.DictReader((run / "timeline.csv").open())]
    assert len(returns) >= 10
    return max(sum(returns[i - 10 : i]) / 10 for i in range(10, len(returns) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("distribution", ["trajectories", "gradients_at_actors"])
def test_both_profiles_learn_cartpole_applying_each_gradient_once(tmp_path: Path, distribution: str) -> None:
    result = stellaris.train({**CARTPOLE, "distribution": distribution, "out": str(tmp_path / "run")})
    mean = learned(result.run_dir)
    print(f"{distribution}: best mean return of 10 consecutive episodes {mean:.0f} after {result.env_steps} env steps")
    assert mean >= THRESHOLD
    rows = list(csv.DictReader((result.run_dir / "gradients.csv").open()))
    assert len(rows) == result.rounds * 4 * 4  # every (epoch, minibatch) of every round, once
    assert len({r["gradient_id"] for r in rows}) == len(rows) and len({r["task_id"] for r in rows}) == len(rows)
