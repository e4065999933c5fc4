"""`recompute_values`: PPO's advantages and returns from the learner's round-start critic instead of the actors'
values, against hand-computed GAE."""

from __future__ import annotations

import pytest
import torch

from contract.algo_config import PPOConfig
from functions.algos.ppo_algo import prepare, with_proximal, with_values
from functions.model.policies import mujoco_actor_critic


def _batch(values: list[float]) -> dict[str, torch.Tensor]:
    """A 2-step rollout of 1 env, rewards 1 and 1, no episode end, bootstrap value 0."""
    return {
        "observations": torch.zeros(2, 1, 3),
        "actions": torch.zeros(2, 1, 2),
        "behaviour_log_probs": torch.zeros(2, 1),
        "rewards": torch.ones(2, 1),
        "values": torch.tensor(values).reshape(2, 1),
        "last_values": torch.zeros(1),
        "terminations": torch.zeros(2, 1),
        "truncations": torch.zeros(2, 1),
        "truncation_values": torch.zeros(2, 1),
    }


def test_advantages_come_from_the_values_given() -> None:
    cfg = PPOConfig(gamma=0.5, lam=1.0, recompute_values=True)
    data = prepare([_batch([0.0, 0.0])], cfg)
    # Actors' values 0, 0: δ = (1, 1); A1 = 1, A0 = 1 + 0.5·1 = 1.5; returns = A + V.
    assert data.advantages.tolist() == [1.5, 1.0] and data.returns.tolist() == [1.5, 1.0]
    # Values 1, 2: δ0 = 1 + 0.5·2 − 1 = 1, δ1 = 1 + 0 − 2 = −1; A1 = −1, A0 = 1 + 0.5·(−1) = 0.5; returns 1.5, 1.
    again = with_values(data, torch.tensor([1.0, 2.0]), cfg)
    assert again.advantages.tolist() == [0.5, -1.0] and again.returns.tolist() == [1.5, 1.0]
    assert again.values.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="3 values for a round of 2 samples"):
        with_values(data, torch.zeros(3), cfg)


def test_the_learner_uses_its_critic_only_when_asked() -> None:
    torch.manual_seed(0)
    policy = mujoco_actor_critic(3, 2, hidden=(8, 8))
    _, _, critic = policy.evaluate(torch.zeros(2, 3), torch.zeros(2, 2))
    for recompute in (False, True):
        cfg = PPOConfig(gamma=0.5, lam=1.0, recompute_values=recompute)
        data = with_proximal(prepare([_batch([0.0, 0.0])], cfg), policy, cfg)
        assert torch.allclose(data.values, critic.detach() if recompute else torch.zeros(2))
        assert data.proximal_log_probs is None  # the spec form (this config's) has no proximal policy
