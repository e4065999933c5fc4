"""The equations of staleness-aware aggregation (Stellaris paper Eq. 3–4, docs/algorithms.md), as pure functions.

δ (``staleness``), β_k (``staleness_threshold``, and ``staleness_bound`` under a ``Schedule``), δ_max
(``calibrate_delta_max``), the per-gradient factor 1/δ^(1/v) (``staleness_scale``) and the mean of the scaled
gradients (``aggregate``, and ``optimizer_step_gradients`` for the steps one aggregation makes). The rules that
decide when to apply them are in ``functions.algos.staleness``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from contract.algo_config import PAPER_ROUNDS, Schedule, StellarisConfig
from contract.knobs import check_knob

if TYPE_CHECKING:
    from torch import Tensor

# The parameters' declared defaults (contract.algo_config); their bounds are checked where a job's config enters, so
# the equations check only d, which a caller may give raw (`_check_d`) and which a bad value would turn into a
# silently wrong β (or a complex one, under the horizon schedules).
_DECLARED = StellarisConfig()


def _check_d(d: float) -> None:
    check_knob("d", d)  # against d's one declaration, contract.knobs


def staleness(current_version: int, base_versions: Iterable[int]) -> list[int]:
    """δ = current version − base version, per gradient (paper §V-C)."""
    deltas = [current_version - base for base in base_versions]
    if any(delta < 0 for delta in deltas):
        raise ValueError(f"a base version is newer than the current version {current_version}")
    return deltas


def _threshold(delta_max: float, decay: float, round_k: int) -> float:
    if round_k < 1:
        raise ValueError(f"rounds count from 1, got {round_k}")
    return delta_max * decay**round_k


def staleness_threshold(delta_max: float, *, d: float, round_k: int) -> float:
    """β_k = δ_max · d^k (paper Eq. 3), for rounds k ≥ 2; d ∈ [0, 1]."""
    _check_d(d)
    return _threshold(delta_max, d, round_k)


def staleness_bound(
    delta_max: float,
    *,
    d: float,
    round_k: int,
    schedule: Schedule,
    horizon_rounds: int | None = None,
    paper_rounds: int = PAPER_ROUNDS,
    beta_floor: float = _DECLARED.beta_floor,
) -> float:
    """β_k of paper Eq. 3 under ``schedule``, for rounds k ≥ 1; d ∈ [0, 1].

    The horizon schedules evaluate Eq. 3 at k_eff = k·paper_rounds/horizon_rounds, i.e. with the per-round
    decay d^(paper_rounds/horizon_rounds); the floor schedules return max(β, beta_floor).
    ``horizon_rounds`` (the run's plan, ≥ 1) is read only by the horizon schedules (None: no horizon known,
    k_eff = k). d = 0 gives β = 0 under every schedule; d = 1 gives β = δ_max, raised to beta_floor by the floor
    schedules.
    """
    _check_d(d)
    schedule = Schedule(schedule)
    decay = d
    if schedule in (Schedule.HORIZON, Schedule.HORIZON_FLOOR) and horizon_rounds is not None:
        decay = d ** (paper_rounds / horizon_rounds)  # δ_max·decay^k = δ_max·d^(k·paper_rounds/horizon_rounds)
    beta = _threshold(delta_max, decay, round_k)
    if schedule in (Schedule.FLOOR, Schedule.HORIZON_FLOOR) and d > 0.0:
        beta = max(beta, beta_floor)
    return beta


def calibrate_delta_max(stalenesses: Iterable[int]) -> int:
    """δ_max = the maximum staleness seen in the unthresholded round 1 (paper §V-C); not the mean."""
    return max(stalenesses, default=0)


def staleness_scale(delta: int, *, v: float) -> float:
    """Per-gradient factor 1/δ^(1/v) when δ > 0, else 1 (paper Eq. 4: α_c = α_0/ᵛ√δ_c); v > 0 (contract.knobs)."""
    return 1.0 / delta ** (1.0 / v) if delta > 0 else 1.0


def aggregate(gradients: Sequence[Mapping[str, Tensor]], scales: Sequence[float]) -> dict[str, Tensor]:
    """g = (1/H)·Σ_i scale_i·g_i: one aggregate of H gradients, applied as one optimizer step with α_0.

    Each gradient is a mapping parameter name → tensor; all must name the same parameters.
    """
    if not gradients:
        raise ValueError("nothing to aggregate")
    if len(gradients) != len(scales):
        raise ValueError(f"{len(gradients)} gradients but {len(scales)} scales")
    import torch  # here, not at the top: the control plane checks configs with this package and never aggregates

    names = list(gradients[0])
    if any(set(gradient) != set(names) for gradient in gradients):
        raise ValueError("gradients name different parameters")
    # One fused kernel per gradient over all parameters (foreach), not a stack and a mean per parameter: the fast
    # preset's parameter function spent a third of its update in the per-parameter version. Fresh tensors either way.
    total = torch._foreach_mul([gradients[0][name] for name in names], scales[0])
    for gradient, scale in zip(gradients[1:], scales[1:], strict=True):
        torch._foreach_add_(total, [gradient[name] for name in names], alpha=scale)
    if len(gradients) > 1:
        torch._foreach_div_(total, float(len(gradients)))
    return dict(zip(names, total, strict=True))


def optimizer_step_gradients(
    gradients: Sequence[Mapping[str, Tensor]], scales: Sequence[float], mode: str = "aggregate"
) -> list[dict[str, Tensor]]:
    """The gradient of each optimizer step one aggregation makes: the mean of the scaled gradients, one step
    ("aggregate", docs/algorithms.md), or each scaled gradient as a step of its own, in order ("each")."""
    if mode == "each":
        return [aggregate([gradient], [scale]) for gradient, scale in zip(gradients, scales, strict=True)]
    if mode != "aggregate":
        raise ValueError(f"optimizer_steps must be 'aggregate' or 'each', got {mode!r}")
    return [aggregate(gradients, scales)]
