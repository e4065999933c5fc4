"""V-trace off-policy targets (Espeholt et al. 2018, IMPALA Eq. 1), used by IMPACT (docs/algorithms.md)."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def vtrace(
    behaviour_log_probs: Tensor,
    target_log_probs: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    discounts: Tensor,
    *,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """V-trace value targets v_s and policy-gradient advantages (IMPALA Eq. 1 with λ = 1).

    μ is the behaviour policy that collected the rollout (``behaviour_log_probs`` = log μ(a_t|s_t)); π is the
    policy being evaluated (``target_log_probs`` = log π(a_t|s_t); in IMPACT, the target network). Tensors
    are time-major ``[T]`` or ``[T, N]``; ``bootstrap_value = V(x_T)`` has shape ``[]`` or ``[N]``;
    ``discounts[t] = γ·(1 − terminated_t)``.

    ρ_t = min(ρ̄, π/μ), c_t = min(c̄, π/μ),  δ_t = ρ_t·(r_t + γ_t·V(x_{t+1}) − V(x_t)),
    v_s − V(x_s) = δ_s + γ_s·c_s·(v_{s+1} − V(x_{s+1})),  A_s = ρ_s·(r_s + γ_s·v_{s+1} − V(x_s)).

    With ``is_weights`` (the Stellaris weight R' of paper Eq. 2, see ``truncation.truncated_is_weight``), R'
    replaces the clipped ρ_t in both δ_t and A_s (docs/algorithms.md); the trace cutting c_t is unchanged.
    Returns ``(vs, pg_advantages)`` without gradient.
    """
    if bootstrap_value.shape != rewards.shape[1:]:
        raise ValueError(f"bootstrap_value must have shape {tuple(rewards.shape[1:])}")
    ratios = torch.exp(target_log_probs - behaviour_log_probs)
    rhos = torch.clamp(ratios, max=rho_bar) if is_weights is None else is_weights.to(values.dtype)
    cs = torch.clamp(ratios, max=c_bar)
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0).to(values.dtype)])
    deltas = rhos * (rewards + discounts * next_values - values)

    vs_minus_values = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + discounts[t] * cs[t] * running
        vs_minus_values[t] = running
    vs = vs_minus_values + values
    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0).to(values.dtype)])
    pg_advantages = rhos * (rewards + discounts * next_vs - values)
    return vs, pg_advantages
