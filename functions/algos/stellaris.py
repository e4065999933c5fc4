"""The Stellaris mechanisms (the paper's Eq. 2–5, docs/algorithms.md) as pure functions and decisions: no I/O.

- Learner side: importance-sampling truncation across the policies other learners hold (Eq. 2:
  ``truncated_is_weight``, ``truncate_ratios``, ``truncation_stats``). ρ is always the job's (``stellaris.rho``, its
  default and bound declared once, in contract.knobs).
- Parameter side, the equations: δ (``staleness``), β_k (``staleness_threshold``, and ``staleness_bound`` under a
  ``Schedule``), δ_max (``calibrate_delta_max``), the per-gradient factor 1/δ^(1/v) (``staleness_scale``) and the mean
  of the scaled gradients (``aggregate``, ``optimizer_step_gradients`` for the steps one aggregation makes).
- Parameter side, the rules: pure decisions over an immutable ``AggregationState`` (round counter and δ_max) and a
  ``QueueSnapshot`` (current version, the base versions of the queued gradients and of the learner tasks of the round
  still in flight). The parameter function evaluates ``decide`` on every enqueue and on every learner completion,
  applies what the record says, then folds the record back with ``observe`` and moves rounds on with ``next_round``.
  Besides Stellaris's, the baseline rules: sync, async, softsync, SSP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import torch
from torch import Tensor

from contract.algo_config import PAPER_ROUNDS, Schedule, StellarisConfig
from contract.jobspec import Plan
from contract.knobs import Rule, check_knob

# The declared defaults: a rule's (contract.knobs, contract.algo_config) and a run's plan's (contract.jobspec). Bounds
# are checked where a job's config enters, so the equations check only d, which a caller may give raw (`_check_d`) and
# which a bad value would turn into a silently wrong β (or a complex one, under the horizon schedules).
_DECLARED, _PLANNED = StellarisConfig(), Plan()


# --- Eq. 2: truncation across the learners' policies ---------------------------------------------------------------


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


# --- Eq. 3–5: staleness, its threshold and scaling -----------------------------------------------------------


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


# --- the aggregation rules ----------------------------------------------------------------------------------------


class Decision(StrEnum):
    """AGGREGATE: the rule admits an update. FLUSH: liveness forced one. DEFER: wait for more gradients."""

    AGGREGATE = "aggregate"
    DEFER = "defer"
    FLUSH = "flush"


@dataclass(frozen=True)
class QueueSnapshot:
    """What the parameter function sees when deciding.

    ``queued_base_versions``: base versions of the queued gradients, oldest first.
    ``in_flight_base_versions``: base versions of the learner tasks of the round still computing.
    """

    current_version: int
    queued_base_versions: tuple[int, ...]
    in_flight_base_versions: tuple[int, ...] = ()

    @property
    def queued_stalenesses(self) -> list[int]:
        return staleness(self.current_version, self.queued_base_versions)

    @property
    def in_flight(self) -> int:
        return len(self.in_flight_base_versions)


@dataclass(frozen=True)
class AggregationState:
    """Round counter k (from 1) and δ_max, unset until the first round's gradients are seen."""

    round_k: int = 1
    delta_max: int | None = None

    @property
    def calibrating(self) -> bool:
        """True while δ_max is being measured: round 1, or until some gradient has been applied."""
        return self.round_k == 1 or self.delta_max is None


@dataclass(frozen=True)
class DecisionRecord:
    """One decision and the staleness values that led to it.

    ``count``: how many queued gradients, oldest first, to aggregate now (0 on DEFER).
    ``threshold``: β_k (under the rule's schedule) for the Stellaris rule after calibration, the SSP bound for
    SSP, else None.
    """

    rule: Rule
    decision: Decision
    count: int
    round_k: int
    stalenesses: tuple[int, ...]
    mean_staleness: float
    max_staleness: int
    threshold: float | None = None

    @property
    def applies(self) -> bool:
        return self.decision is not Decision.DEFER and self.count > 0


def _record(
    rule: Rule,
    decision: Decision,
    state: AggregationState,
    snapshot: QueueSnapshot,
    *,
    count: int | None = None,
    threshold: float | None = None,
) -> DecisionRecord:
    deltas = snapshot.queued_stalenesses
    if not deltas:
        decision = Decision.DEFER
    if decision is Decision.DEFER:
        count = 0
    elif count is None:
        count = len(deltas)
    return DecisionRecord(
        rule=rule,
        decision=decision,
        count=count,
        round_k=state.round_k,
        stalenesses=tuple(deltas),
        mean_staleness=sum(deltas) / len(deltas) if deltas else 0.0,
        max_staleness=max(deltas, default=0),
        threshold=threshold,
    )


def decide_stellaris(
    state: AggregationState,
    snapshot: QueueSnapshot,
    *,
    d: float,
    schedule: Schedule = _DECLARED.schedule,
    horizon_rounds: int | None = _PLANNED.horizon_rounds,
    paper_rounds: int = PAPER_ROUNDS,
    beta_floor: float = _DECLARED.beta_floor,
    max_aggregate: int = _DECLARED.max_aggregate,
) -> DecisionRecord:
    """Stellaris rule (paper §V-C, Eq. 3), each update taking at most ``max_aggregate`` of the oldest queued
    gradients when it is above 0 (the rule decides again on the rest; 0: the whole queue, as the paper).

    While calibrating (round 1) there is no threshold: every gradient is aggregated on arrival, and
    ``observe`` records δ_max. At round k ≥ 2 the whole queue is aggregated iff its mean staleness
    ≤ β_k = δ_max·d^k (``staleness_bound`` under ``schedule``); otherwise it is deferred, unless no learner
    task of the round is still in flight, in which case it is flushed (liveness). d = 1 keeps β at the
    staleness of pure asynchrony; d = 0 is full synchrony in every round and under every schedule: the queue
    is aggregated once all learner tasks of the round have finished ("d=0 removes the threshold and forces the
    parameter function to synchronize all learners"). d ∈ [0, 1] (contract.knobs; `staleness_bound` checks it).
    """
    record = _decide_stellaris(state, snapshot, d, schedule, horizon_rounds, paper_rounds, beta_floor)
    if 0 < max_aggregate < record.count:
        return replace(record, count=max_aggregate)
    return record


def _decide_stellaris(
    state: AggregationState,
    snapshot: QueueSnapshot,
    d: float,
    schedule: Schedule,
    horizon_rounds: int | None,
    paper_rounds: int,
    beta_floor: float,
) -> DecisionRecord:
    if d == 0.0:
        decision = Decision.AGGREGATE if snapshot.in_flight == 0 else Decision.DEFER
        return _record(Rule.STELLARIS, decision, state, snapshot, threshold=0.0)
    if state.calibrating:
        return _record(Rule.STELLARIS, Decision.AGGREGATE, state, snapshot)
    assert state.delta_max is not None
    beta = staleness_bound(
        state.delta_max,
        d=d,
        round_k=state.round_k,
        schedule=schedule,
        horizon_rounds=horizon_rounds,
        paper_rounds=paper_rounds,
        beta_floor=beta_floor,
    )
    deltas = snapshot.queued_stalenesses
    if deltas and sum(deltas) / len(deltas) <= beta:
        decision = Decision.AGGREGATE
    elif snapshot.in_flight == 0:
        decision = Decision.FLUSH
    else:
        decision = Decision.DEFER
    return _record(Rule.STELLARIS, decision, state, snapshot, threshold=beta)


def decide_sync(state: AggregationState, snapshot: QueueSnapshot, *, expected: int | None = None) -> DecisionRecord:
    """Synchronous rule: average all learner gradients of a step once all have arrived.

    ``expected`` is the number of learner tasks of the step; None means every task the snapshot knows of
    (queued + in flight). Fewer than expected with nothing in flight (a lost learner) is flushed.
    """
    queued = len(snapshot.queued_base_versions)
    if expected is None:
        expected = queued + snapshot.in_flight
    if queued >= expected:
        decision = Decision.AGGREGATE
    elif snapshot.in_flight == 0:
        decision = Decision.FLUSH
    else:
        decision = Decision.DEFER
    return _record(Rule.SYNC, decision, state, snapshot)


def decide_async(state: AggregationState, snapshot: QueueSnapshot) -> DecisionRecord:
    """Pure asynchrony: each gradient is applied on its own, oldest first (one optimizer step per gradient)."""
    return _record(Rule.ASYNC, Decision.AGGREGATE, state, snapshot, count=1)


def decide_softsync(state: AggregationState, snapshot: QueueSnapshot, *, k: int) -> DecisionRecord:
    """Softsync (Zhang et al. 2016): aggregate the K oldest gradients once K are queued (K ≥ 1: `softsync_k`,
    contract.knobs); flush when idle."""
    if len(snapshot.queued_base_versions) >= k:
        return _record(Rule.SOFTSYNC, Decision.AGGREGATE, state, snapshot, count=k)
    decision = Decision.FLUSH if snapshot.in_flight == 0 else Decision.DEFER
    return _record(Rule.SOFTSYNC, decision, state, snapshot)


def decide_ssp(state: AggregationState, snapshot: QueueSnapshot, *, bound: int) -> DecisionRecord:
    """Stale-synchronous parallel (Ho et al. 2013) with staleness bound s.

    Applying the queue advances the version to v + 1, so an in-flight learner holding base version b will
    deliver a gradient at least (v + 1) − b stale. The queue is aggregated on arrival iff that stays ≤ s
    for every in-flight learner, i.e. (v + 1) − min_j b_j ≤ s; otherwise the update waits for the slowest
    learners to deliver. With nothing in flight nothing can fall behind, so the queue is aggregated. s ≥ 0
    (`ssp_bound`, contract.knobs).
    """
    in_flight = snapshot.in_flight_base_versions
    lag_after = snapshot.current_version + 1 - min(in_flight) if in_flight else 0
    decision = Decision.AGGREGATE if lag_after <= bound else Decision.DEFER
    return _record(Rule.SSP, decision, state, snapshot, threshold=float(bound))


@dataclass(frozen=True)
class AggregationRule:
    """A rule and its parameters: d, v and β's schedule (Stellaris), K (softsync), s (SSP), and the run's planned
    rounds that the horizon schedules read. A job's rule is `aggregation_rule` of its validated config and plan; the
    defaults here are those declarations' (contract.knobs, contract.algo_config, contract.jobspec), not values of
    their own."""

    rule: Rule = _DECLARED.rule
    d: float = _DECLARED.d
    v: float = _DECLARED.v
    schedule: Schedule = _DECLARED.schedule
    horizon_rounds: int | None = _PLANNED.horizon_rounds
    paper_rounds: int = PAPER_ROUNDS
    beta_floor: float = _DECLARED.beta_floor
    max_aggregate: int = _DECLARED.max_aggregate
    softsync_k: int = _DECLARED.softsync_k
    ssp_bound: int = _DECLARED.ssp_bound


def aggregation_rule(stellaris: StellarisConfig, plan: Plan) -> AggregationRule:
    """The rule a job's `stellaris` section configures, over the job's planned run."""
    return AggregationRule(
        rule=stellaris.rule,
        d=stellaris.d,
        v=stellaris.v,
        softsync_k=stellaris.softsync_k,
        ssp_bound=stellaris.ssp_bound,
        schedule=stellaris.schedule,
        horizon_rounds=plan.horizon_rounds,
        beta_floor=stellaris.beta_floor,
        max_aggregate=stellaris.max_aggregate,
    )


def applies_from_queue_alone(rule: AggregationRule) -> bool:
    """Whether the rule's decision to apply depends on the queued gradients alone: then work in flight only turns a
    deferral into a flush, and a caller may decide without looking at it first, as long as it looks before it
    defers. True for the Stellaris rule with d > 0 (d = 0 waits for the round's tasks) and for async."""
    return (rule.rule is Rule.STELLARIS and rule.d > 0.0) or rule.rule is Rule.ASYNC


def decide(
    rule: AggregationRule, state: AggregationState, snapshot: QueueSnapshot, *, sync_expected: int | None = None
) -> DecisionRecord:
    """Dispatch to the rule's decision function."""
    match rule.rule:
        case Rule.STELLARIS:
            return decide_stellaris(
                state,
                snapshot,
                d=rule.d,
                schedule=rule.schedule,
                horizon_rounds=rule.horizon_rounds,
                paper_rounds=rule.paper_rounds,
                beta_floor=rule.beta_floor,
                max_aggregate=rule.max_aggregate,
            )
        case Rule.SYNC:
            return decide_sync(state, snapshot, expected=sync_expected)
        case Rule.ASYNC:
            return decide_async(state, snapshot)
        case Rule.SOFTSYNC:
            return decide_softsync(state, snapshot, k=rule.softsync_k)
        case Rule.SSP:
            return decide_ssp(state, snapshot, bound=rule.ssp_bound)
    raise ValueError(f"unknown rule {rule.rule!r}")


def gradient_scales(rule: AggregationRule, stalenesses: Iterable[int]) -> list[float]:
    """Per-gradient scales: 1/δ^(1/v) under the Stellaris rule (paper Eq. 4); 1 for the baselines."""
    if rule.rule is Rule.STELLARIS:
        return [staleness_scale(delta, v=rule.v) for delta in stalenesses]
    return [1.0 for _ in stalenesses]


def observe(state: AggregationState, record: DecisionRecord) -> AggregationState:
    """Fold an applied decision into the state: while calibrating, δ_max = max staleness applied so far."""
    if not record.applies or not state.calibrating:
        return state
    seen = record.stalenesses[: record.count]
    return replace(state, delta_max=calibrate_delta_max([state.delta_max or 0, *seen]))


def next_round(state: AggregationState) -> AggregationState:
    """Start round k + 1."""
    return replace(state, round_k=state.round_k + 1)
