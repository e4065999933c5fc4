"""PPO loss (Schulman et al. 2017) with the Stellaris truncated ratio (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor


@dataclass(frozen=True)
class PPOLossTerms:
    """Named PPO loss terms; ``total`` is the one to differentiate. Diagnostics carry no gradient."""

    policy_loss: Tensor
    value_loss: Tensor
    kl_penalty: Tensor
    entropy: Tensor
    total: Tensor
    clip_fraction: Tensor
    approx_kl: Tensor


def truncated_ratio(ratio: Tensor, is_weights: Tensor | None) -> Tensor:
    """r̃ = r · stopgrad(R'/r) (docs/algorithms.md): valued R', with the gradient of r scaled by R'/r.

    r = π_θ(a|s)/μ(a|s) is the learner policy π_θ over the behaviour policy μ; R' is the weight of paper
    Eq. 2. Without ``is_weights`` this is r itself (vanilla PPO).
    """
    if is_weights is None:
        return ratio
    weights = is_weights.to(ratio.dtype)
    # a ratio that underflowed to 0 has R' = 0 (R' ≤ own ratio); avoid 0/0
    scale = torch.where(ratio > 0, weights / ratio, torch.zeros_like(ratio))
    return ratio * scale.detach()


TruncationForm = Literal["surrogate", "weighted", "decoupled"]


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip: float,
    is_weights: Tensor | None = None,
    form: TruncationForm = "surrogate",
    proximal: Tensor | None = None,
) -> Tensor:
    """Per-sample PPO objective with the Stellaris weight R' (PPO Eq. 7, paper §V-A, Eq. 2).

    r = π_θ/μ with π_θ the learner policy and μ the behaviour policy.
    - ``surrogate`` (docs/algorithms.md): min(r̃·A, clip(r, 1 − ε, 1 + ε)·A), r̃ = ``truncated_ratio(r, R')``.
      Since R' ≤ ρ = 1 < 1 + ε, the unclipped term wins for every A > 0, so the clip never stops a positive
      advantage's gradient: PPO's trust region is gone on that side, and epochs keep pushing.
    - ``weighted``: stopgrad(R'/r)·min(r·A, clip(r, 1 − ε, 1 + ε)·A): vanilla PPO's clip decides which samples
      carry a gradient, and each one's gradient is R'·A·∇log π_θ, the same as ``surrogate`` inside the trust
      region.
    - ``decoupled`` (decoupled PPO, Hilton et al. 2022; RLlib's APPO): the clip is taken on ``proximal`` =
      π_θ/π_prox, the ratio to a proximal policy (the round's first policy), not to μ, which can be a round older:
      stopgrad(R'/p)·min(p·A, clip(p, 1 − ε, 1 + ε)·A). Inside the trust region each sample's gradient is R'·A·∇log
      π_θ, as in the other forms; without ``is_weights`` the weight is π_prox/μ (r/p), as in that paper.
    """
    if form == "decoupled":
        if proximal is None:
            raise ValueError("the decoupled form needs `proximal`, the ratio of π_θ to the proximal policy")
        value = ratio if is_weights is None else is_weights.to(ratio.dtype)
        weight = torch.where(proximal > 0, value / proximal, torch.zeros_like(proximal)).detach()
        clipped = torch.clamp(proximal, 1.0 - clip, 1.0 + clip) * advantages
        return weight * torch.minimum(proximal * advantages, clipped)
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    if form == "weighted" and is_weights is not None:
        weight = torch.where(ratio > 0, is_weights.to(ratio.dtype) / ratio, torch.zeros_like(ratio)).detach()
        return weight * torch.minimum(ratio * advantages, clipped)
    unclipped = truncated_ratio(ratio, is_weights) * advantages
    return torch.minimum(unclipped, clipped)


def value_loss(
    values: Tensor,
    returns: Tensor,
    *,
    old_values: Tensor | None = None,
    vf_clip: float | None = None,
    sample_weights: Tensor | None = None,
) -> Tensor:
    """½·mean((V − R)²); with ``old_values`` and ``vf_clip`` the PPO2 clipped form ½·mean(max(·, ·)); with
    ``sample_weights`` each sample's term is scaled before the mean."""
    squared = (values - returns) ** 2
    if old_values is not None and vf_clip is not None:
        clipped_values = old_values + torch.clamp(values - old_values, -vf_clip, vf_clip)
        squared = torch.maximum(squared, (clipped_values - returns) ** 2)
    if sample_weights is not None:
        squared = sample_weights * squared
    return 0.5 * squared.mean()


def ppo_loss(
    new_log_probs: Tensor,
    behaviour_log_probs: Tensor,
    advantages: Tensor,
    values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    kl: Tensor | None,
    *,
    clip: float,
    kl_coef: float,
    vf_coef: float,
    ent_coef: float,
    is_weights: Tensor | None = None,
    truncation_form: TruncationForm = "surrogate",
    old_values: Tensor | None = None,
    vf_clip: float | None = None,
    sample_weights: Tensor | None = None,
    proximal_log_probs: Tensor | None = None,
) -> PPOLossTerms:
    """PPO loss: −surrogate + c_v·value loss + β_KL·KL − c_e·entropy, summed here and nowhere else.

    π_θ is the learner policy being trained (``new_log_probs`` = log π_θ(a|s), with gradient) and μ the
    behaviour policy that collected the batch (``behaviour_log_probs``). ``kl`` is the per-sample
    KL(μ ‖ π_θ) (RLlib's adaptive-KL term; may be None when ``kl_coef`` is 0), ``entropy`` the per-sample
    entropy of π_θ, ``values`` the critic output for the batch and ``returns`` its targets. ``is_weights``
    is R' (paper Eq. 2); with it the unclipped term uses r̃ (see ``clipped_surrogate``). ``sample_weights``
    (prioritized replay's importance weights, APPO) scale each sample's surrogate and value term before the mean.
    ``proximal_log_probs`` (log π_prox(a|s)) centre the ``decoupled`` form's clip; ``clip_fraction`` is measured
    on the ratio that is clipped.
    """
    ratio = torch.exp(new_log_probs - behaviour_log_probs)
    proximal = None if proximal_log_probs is None else torch.exp(new_log_probs - proximal_log_probs)
    surrogate = clipped_surrogate(
        ratio, advantages, clip=clip, is_weights=is_weights, form=truncation_form, proximal=proximal
    )
    if sample_weights is not None:
        surrogate = sample_weights * surrogate
    policy_loss = -surrogate.mean()
    v_loss = value_loss(values, returns, old_values=old_values, vf_clip=vf_clip, sample_weights=sample_weights)
    if kl is None:
        if kl_coef != 0.0:
            raise ValueError("kl is required when kl_coef is non-zero")
        kl_penalty = torch.zeros((), dtype=policy_loss.dtype, device=policy_loss.device)
    else:
        kl_penalty = kl_coef * kl.mean()
    mean_entropy = entropy.mean()
    total = policy_loss + vf_coef * v_loss + kl_penalty - ent_coef * mean_entropy
    with torch.no_grad():
        clipped_ratio = proximal if truncation_form == "decoupled" and proximal is not None else ratio
        clip_fraction = ((clipped_ratio - 1.0).abs() > clip).float().mean()
        approx_kl = ((ratio - 1.0) - torch.log(ratio)).mean()
    return PPOLossTerms(
        policy_loss=policy_loss,
        value_loss=v_loss,
        kl_penalty=kl_penalty,
        entropy=mean_entropy,
        total=total,
        clip_fraction=clip_fraction,
        approx_kl=approx_kl,
    )


def adaptive_kl_coef(kl_coef: float, observed_kl: float, *, target: float) -> float:
    """RLlib's adaptive KL rule: ×1.5 when KL > 2·target, ×0.5 when KL < ½·target, else unchanged."""
    if observed_kl > 2.0 * target:
        return kl_coef * 1.5
    if observed_kl < 0.5 * target:
        return kl_coef * 0.5
    return kl_coef
