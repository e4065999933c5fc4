"""Importance-sampling truncation across learner policies (Stellaris paper Eq. 2, docs/algorithms.md). ρ is always
the job's (`stellaris.rho`: its default and bound are declared once, in contract.knobs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _learner_ratios(own_log_probs: Tensor, other_log_probs: Tensor, behaviour_log_probs: Tensor) -> Tensor:
    """Stack π_θi(a|s)/μ(a|s) for the learner's own policy (row 0) and the K others: ``[K + 1, *S]``."""
    if other_log_probs.shape[1:] != own_log_probs.shape:
        raise ValueError(
            f"other_log_probs must be [K, {', '.join(map(str, own_log_probs.shape))}], "
            f"got {tuple(other_log_probs.shape)}"
        )
    log_probs = torch.cat([own_log_probs.detach().unsqueeze(0), other_log_probs.detach()])
    return torch.exp(log_probs - behaviour_log_probs.detach())


def truncate_ratios(ratios: Tensor, *, rho: float) -> Tensor:
    """Paper Eq. 2 on a stack of ratios ``[n, *S]``: R' = min(|min_i ratios_i|, ρ).

    ``ratios[i] = π_θi(a|s)/μ(a|s)`` for the n learner policies π_θi held by in-flight learners and the
    behaviour policy μ that collected the sample. The absolute value is taken of the minimum, as written.
    """
    return torch.clamp(torch.abs(torch.amin(ratios, dim=0)), max=rho)


@torch.no_grad()
def truncated_is_weight(
    own_log_probs: Tensor, other_log_probs: Tensor, behaviour_log_probs: Tensor, *, rho: float
) -> Tensor:
    """The Stellaris IS weight R' = min(|min_i π_θi(a|s)/μ(a|s)|, ρ) (paper Eq. 2, docs/algorithms.md).

    μ is the behaviour (actor) policy: ``behaviour_log_probs`` = log μ(a|s), shape S (e.g. ``[B]``).
    The π_θi are the learner policies: the learner's own π_θ (``own_log_probs``, shape S) and the K
    policies of the other in-flight learners at distinct versions (``other_log_probs``, ``[K, *S]``,
    K may be 0). Computed without gradient; use it through ``ppo.truncated_ratio`` or as V-trace's ρ.
    """
    return truncate_ratios(_learner_ratios(own_log_probs, other_log_probs, behaviour_log_probs), rho=rho)


@dataclass(frozen=True)
class TruncationStats:
    """Per-gradient report of the truncation (docs/algorithms.md).

    ``fraction_truncated``: share of samples whose |min_i π_θi/μ| exceeded ρ and was clipped to ρ;
    ``mean_weight``: mean R'.
    """

    fraction_truncated: float
    mean_weight: float


@torch.no_grad()
def truncation_stats(
    own_log_probs: Tensor, other_log_probs: Tensor, behaviour_log_probs: Tensor, *, rho: float
) -> TruncationStats:
    """Fraction truncated and mean R' for one gradient's batch (paper Eq. 2)."""
    ratios = _learner_ratios(own_log_probs, other_log_probs, behaviour_log_probs)
    min_ratio = torch.abs(torch.amin(ratios, dim=0))
    weights = truncate_ratios(ratios, rho=rho)
    return TruncationStats(
        fraction_truncated=(min_ratio > rho).float().mean().item(),
        mean_weight=weights.float().mean().item(),
    )
