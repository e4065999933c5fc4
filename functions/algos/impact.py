"""IMPACT loss (Luo et al. 2020; RLlib's APPO) with the Stellaris weight as V-trace's ρ (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from functions.algos.ppo import clipped_surrogate
from functions.algos.vtrace import vtrace


@dataclass(frozen=True)
class IMPACTLossTerms:
    """Named IMPACT loss terms; ``total`` is the one to differentiate. Diagnostics carry no gradient."""

    policy_loss: Tensor
    value_loss: Tensor
    kl_penalty: Tensor
    entropy: Tensor
    total: Tensor
    clip_fraction: Tensor
    mean_kl: Tensor
    vs: Tensor
    pg_advantages: Tensor


def impact_loss(
    new_log_probs: Tensor,
    target_log_probs: Tensor,
    behaviour_log_probs: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    discounts: Tensor,
    entropy: Tensor,
    kl: Tensor,
    *,
    clip: float,
    kl_coef: float,
    vf_coef: float,
    ent_coef: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    is_weights: Tensor | None = None,
    sample_weights: Tensor | None = None,
) -> IMPACTLossTerms:
    """IMPACT: V-trace w.r.t. the target network, clipped surrogate w.r.t. it, KL, entropy, value loss.

    Three policies: π_θ the learner policy being trained (``new_log_probs``, with gradient), π_target the
    target network (``target_log_probs``) and μ the behaviour policy that collected the rollout
    (``behaviour_log_probs``). Per-step tensors are time-major ``[T]`` or ``[T, N]``; ``bootstrap_value``
    is V(x_T); ``discounts[t] = γ·(1 − terminated_t)``; ``values`` is the critic output (with gradient);
    ``kl`` the per-sample KL(π_target ‖ π_θ); ``entropy`` the per-sample entropy of π_θ.

    1. (v_s, A_s) = V-trace with π = π_target and μ (ρ̄, c̄); with ``is_weights`` R' (paper Eq. 2) replaces
       V-trace's per-sample ρ (docs/algorithms.md).
    2. surrogate = min(r·A_s, clip(r, 1 − ε, 1 + ε)·A_s) with r = π_θ/π_target (ε = 0.4 in Table III).
    3. total = −mean(w·surrogate) + c_v·½·mean(w·(V − v_s)²) + β_KL·mean(KL) − c_e·mean(entropy), where w
       (``sample_weights``) is prioritized replay's importance weight of each sample (Schaul et al. 2016: it scales
       the per-sample loss before the mean, not normalised by Σw) and 1 without it.
    """
    vs, pg_advantages = vtrace(
        behaviour_log_probs,
        target_log_probs,
        rewards,
        values.detach(),
        bootstrap_value.detach(),
        discounts,
        rho_bar=rho_bar,
        c_bar=c_bar,
        is_weights=is_weights,
    )
    ratio = torch.exp(new_log_probs - target_log_probs.detach())
    surrogate = clipped_surrogate(ratio, pg_advantages, clip=clip)
    squared_error = (values - vs) ** 2
    if sample_weights is not None:
        surrogate, squared_error = sample_weights * surrogate, sample_weights * squared_error
    policy_loss = -surrogate.mean()
    value_loss = 0.5 * squared_error.mean()
    mean_kl = kl.mean()
    kl_penalty = kl_coef * mean_kl
    mean_entropy = entropy.mean()
    total = policy_loss + vf_coef * value_loss + kl_penalty - ent_coef * mean_entropy
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
    return IMPACTLossTerms(
        policy_loss=policy_loss,
        value_loss=value_loss,
        kl_penalty=kl_penalty,
        entropy=mean_entropy,
        total=total,
        clip_fraction=clip_fraction,
        mean_kl=mean_kl.detach(),
        vs=vs,
        pg_advantages=pg_advantages,
    )


def should_update_target(rounds_since_update: int, *, target_update_frequency: float) -> bool:
    """Whether to copy π_θ into the target network π_target now (Table III "target update frequency").

    The frequency is in rounds (train batches): 1.0 updates the target after every round, 2.0 after every
    second round; values below 1 also mean every round, the finest granularity a round allows. The KL
    coefficient is adapted at the same moment (``ppo.adaptive_kl_coef``), as RLlib's APPO does.
    """
    if target_update_frequency <= 0:
        raise ValueError("target_update_frequency must be positive")
    return rounds_since_update >= max(1.0, target_update_frequency)
