"""Generalised advantage estimation (Schulman et al. 2016), the PPO advantage of docs/algorithms.md."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    terminations: Tensor,
    truncations: Tensor,
    *,
    gamma: float,
    lam: float,
    truncation_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) advantages and λ-returns over a time-major rollout.

    All per-step tensors are time-major, ``[T]`` or ``[T, N]`` (N parallel envs). Step t took action a_t in
    s_t under the behaviour policy μ (the actor's policy; GAE itself involves no target policy π):

    - ``values[t] = V(s_t)``; ``bootstrap_value = V(s_T)``, shape ``[]`` or ``[N]``, the value of the
      observation after the last step;
    - ``terminations[t]``: s_{t+1} is terminal, nothing is bootstrapped past it;
    - ``truncations[t]``: the episode was cut by a time limit after step t, so the next stored observation
      belongs to a new episode. The step bootstraps from ``truncation_values[t]`` (V of the true final
      observation) when given; without ``truncation_values`` it does not bootstrap (treated like a
      termination, as CleanRL does). A step both terminated and truncated counts as terminated.

    δ_t = r_t + γ·V'_{t+1} − V(s_t), with V'_{t+1} = 0 on termination, the final-observation value on
    truncation, else V(s_{t+1});  A_t = δ_t + γλ·(1 − done_t)·A_{t+1};  returns = A + V.
    The recursion never crosses an episode boundary. Returns ``(advantages, returns)`` without gradient.
    """
    if rewards.shape != values.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} differ in shape")
    if bootstrap_value.shape != rewards.shape[1:]:
        raise ValueError(f"bootstrap_value must have shape {tuple(rewards.shape[1:])}")
    terminated = terminations.to(torch.bool)
    truncated = truncations.to(torch.bool) & ~terminated
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0).to(values.dtype)])
    if truncation_values is None:
        next_values = torch.where(truncated, torch.zeros_like(next_values), next_values)
    else:
        next_values = torch.where(truncated, truncation_values.to(values.dtype), next_values)
    next_values = torch.where(terminated, torch.zeros_like(next_values), next_values)
    deltas = rewards + gamma * next_values - values
    continues = (~(terminated | truncated)).to(values.dtype)

    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * continues[t] * running
        advantages[t] = running
    return advantages, advantages + values
