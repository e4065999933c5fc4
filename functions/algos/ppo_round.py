"""What PPO's two gradient paths share: a round's samples as ``ppo_algo.prepare`` makes them, read by both
``ppo_algo.gradient`` (torch) and ``ppo_numpy.gradient`` (NumPy)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class PPORound:
    """A round's samples flattened over time and envs, with GAE advantages and returns (from the actors' values,
    so the same for every task of the round: computed once per learner instance and round), and, for the decoupled
    clip, their log-probs under the instance's first policy of the round."""

    obs: Tensor
    actions: Tensor
    behaviour_log_probs: Tensor
    advantages: Tensor
    returns: Tensor
    values: Tensor
    proximal_log_probs: Tensor | None = None
    rollouts: tuple[Rollout, ...] = ()  # what GAE needs to run again on other values (recompute_values)


@dataclass(frozen=True)
class Rollout:
    """One batch's GAE inputs, time-major [T, N], but for its values (the bootstraps stay the actor's)."""

    rewards: Tensor
    bootstrap_value: Tensor
    terminations: Tensor
    truncations: Tensor
    truncation_values: Tensor
