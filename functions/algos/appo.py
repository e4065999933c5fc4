"""APPO loss: asynchronous PPO with V-trace off-policy correction (Sample Factory, Petrenko et al. 2020; RLlib's
APPO), with the Stellaris weight in place of V-trace's ρ and PPO's ratio (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from functions.algos.ppo import PPOLossTerms, TruncationForm, ppo_loss
from functions.algos.vtrace import vtrace


@dataclass(frozen=True)
class APPOLossTerms(PPOLossTerms):
    """PPO's named terms plus V-trace's value targets v_s and policy-gradient advantages (diagnostics)."""

    vs: Tensor
    pg_advantages: Tensor


def appo_loss(
    new_log_probs: Tensor,
    behaviour_log_probs: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    discounts: Tensor,
    entropy: Tensor,
    kl: Tensor | None,
    *,
    clip: float,
    kl_coef: float,
    vf_coef: float,
    ent_coef: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    normalize_advantages: bool = False,
    is_weights: Tensor | None = None,
    truncation_form: TruncationForm = "surrogate",
    sample_weights: Tensor | None = None,
) -> APPOLossTerms:
    """APPO: V-trace w.r.t. the learner policy, PPO's clipped surrogate on π_θ/μ, KL, entropy, value loss.

    π_θ is the learner policy being trained (``new_log_probs``, with gradient) and μ the behaviour policy that
    collected the rollout (``behaviour_log_probs``). Per-step tensors are time-major ``[T]`` or ``[T, N]``;
    ``bootstrap_value`` is V(x_T); ``discounts[t] = γ·(1 − done_t)``; ``values`` the critic output (with gradient);
    ``kl`` the per-sample KL(π_target ‖ π_θ) to a target network (None when ``kl_coef`` is 0); ``entropy`` the
    per-sample entropy of π_θ.

    1. (v_s, A_s) = V-trace with π = stopgrad(π_θ) and μ (ρ̄, c̄): A_s = ρ_s·(r_s + γ_s·v_{s+1} − V(x_s)), as
       Sample Factory; standardised over the minibatch with ``normalize_advantages``.
    2. surrogate = min(r·A_s, clip(r, 1 − ε, 1 + ε)·A_s) with r = π_θ/μ (PPO Eq. 7).
    3. total = −mean(surrogate) + c_v·½·mean((V − v_s)²) + β_KL·mean(KL) − c_e·mean(entropy).

    With ``is_weights`` (R' of paper Eq. 2) R' replaces V-trace's ρ and values the surrogate's ratio as in PPO
    (``ppo.clipped_surrogate`` with ``truncation_form``): each IS ratio of the loss becomes the Stellaris weight.
    """
    vs, pg_advantages = vtrace(
        behaviour_log_probs,
        new_log_probs.detach(),
        rewards,
        values.detach(),
        bootstrap_value.detach(),
        discounts,
        rho_bar=rho_bar,
        c_bar=c_bar,
        is_weights=is_weights,
    )
    advantages = pg_advantages
    if normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    # From here on it is PPO's loss with V-trace's targets: surrogate, ½·mean((V − v_s)²), KL, entropy.
    terms = ppo_loss(
        new_log_probs,
        behaviour_log_probs,
        advantages,
        values,
        vs,
        entropy,
        kl,
        clip=clip,
        kl_coef=kl_coef,
        vf_coef=vf_coef,
        ent_coef=ent_coef,
        is_weights=is_weights,
        truncation_form=truncation_form,
        sample_weights=sample_weights,  # prioritized replay's importance weights (as IMPACT's)
    )
    return APPOLossTerms(**vars(terms), vs=vs, pg_advantages=pg_advantages)
