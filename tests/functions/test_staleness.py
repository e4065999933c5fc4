"""Paper Eq. 3–4, the aggregate, and the aggregation rules as pure decisions."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contract.algo_config import AlgoName, EnvKind, PresetName, Rule, Schedule, StellarisConfig, preset
from contract.jobspec import Plan, resolve_algo
from functions.algos.stellaris import (
    AggregationRule,
    AggregationState,
    Decision,
    QueueSnapshot,
    aggregate,
    aggregation_rule,
    applies_from_queue_alone,
    calibrate_delta_max,
    decide,
    decide_async,
    decide_softsync,
    decide_ssp,
    decide_stellaris,
    decide_sync,
    gradient_scales,
    next_round,
    observe,
    optimizer_step_gradients,
    staleness,
    staleness_bound,
    staleness_scale,
    staleness_threshold,
)

CALIBRATED = AggregationState(round_k=2, delta_max=4)


def _snapshot(current: int, queued: Sequence[int], in_flight: Sequence[int] = ()) -> QueueSnapshot:
    return QueueSnapshot(current, tuple(queued), tuple(in_flight))


# --- equations ---------------------------------------------------------------------------------------------


def test_staleness_is_current_minus_base() -> None:
    assert staleness(10, [10, 8, 7]) == [0, 2, 3]
    with pytest.raises(ValueError, match="newer"):
        staleness(3, [4])


def test_threshold_eq3() -> None:
    # β_k = δ_max·d^k: 10·0.5² = 2.5;  d = 1 keeps δ_max;  d = 0 gives 0
    assert staleness_threshold(10, d=0.5, round_k=2) == pytest.approx(2.5)
    assert staleness_threshold(10, d=1.0, round_k=500) == 10
    assert staleness_threshold(10, d=0.0, round_k=2) == 0
    assert staleness_threshold(6, d=0.96, round_k=3) == pytest.approx(6 * 0.96**3)
    with pytest.raises(ValueError, match=r"^d: Input should be less than or equal to 1, got 1.2$"):
        staleness_threshold(10, d=1.2, round_k=2)  # d's bounds are its declaration's (contract.knobs)
    with pytest.raises(ValueError, match=r"^d: Input should be greater than or equal to 0, got -0.5$"):
        staleness_threshold(10, d=-0.5, round_k=2)


def test_delta_max_is_the_maximum_not_the_mean() -> None:
    # the original code took the mean (4) of [1, 2, 9]; paper §V-C says the maximum staleness
    stalenesses = [1, 2, 9]
    assert calibrate_delta_max(stalenesses) == 9
    assert calibrate_delta_max(stalenesses) != sum(stalenesses) / len(stalenesses)
    assert calibrate_delta_max([]) == 0


def test_scale_eq4() -> None:
    # 1/δ^(1/v): 8^(1/3) = 2 → 0.5;  27^(1/3) = 3 → 1/3;  δ = 0 and δ = 1 → 1
    assert staleness_scale(8, v=3) == pytest.approx(0.5)
    assert staleness_scale(27, v=3) == pytest.approx(1 / 3)
    assert staleness_scale(4, v=2) == pytest.approx(0.5)
    assert staleness_scale(0, v=3) == 1.0
    assert staleness_scale(1, v=3) == 1.0
    with pytest.raises(ValidationError, match="greater than 0"):  # v's bound is checked where a config enters
        StellarisConfig(v=0)


def test_scale_actually_multiplies_the_applied_update() -> None:
    # The original code's learning-rate scaling never took effect. Here a gradient with δ = 8 (v = 3) moves
    # the parameters by α0·g/2 under SGD, half of what the same gradient moves them with δ = 0.
    grad = {"w": torch.tensor([1.0, -2.0])}
    moves = []
    for delta in (0, 8):
        weight = torch.nn.Parameter(torch.tensor([3.0, 3.0]))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        weight.grad = aggregate([grad], [staleness_scale(delta, v=3)])["w"]
        optimizer.step()
        moves.append(weight.detach() - 3.0)
    torch.testing.assert_close(moves[0], torch.tensor([-0.1, 0.2]))
    torch.testing.assert_close(moves[1], torch.tensor([-0.05, 0.1]))


def test_aggregate_is_one_mean_of_scaled_gradients() -> None:
    # (1·[2, 4] + 0.5·[4, 0] + 0.25·[8, 8]) / 3 = ([2, 4] + [2, 0] + [2, 2]) / 3 = [2, 2]
    gradients = [{"w": torch.tensor([2.0, 4.0])}, {"w": torch.tensor([4.0, 0.0])}, {"w": torch.tensor([8.0, 8.0])}]
    torch.testing.assert_close(aggregate(gradients, [1.0, 0.5, 0.25])["w"], torch.tensor([2.0, 2.0]))
    # one SGD step with the aggregate differs from applying the three gradients one by one (their sum)
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    weight.grad = aggregate(gradients, [1.0, 0.5, 0.25])["w"]
    optimizer.step()
    torch.testing.assert_close(weight.detach(), torch.tensor([-2.0, -2.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_aggregate_matches_slow_reference(seed: int, count: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    shapes = {"actor.0.weight": (4, 3), "actor.0.bias": (4,), "log_std": (2,)}
    gradients = [
        {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()} for _ in range(count)
    ]
    scales = torch.rand(count, generator=generator).tolist()
    result = aggregate(gradients, scales)
    for name, shape in shapes.items():
        flat = [0.0] * torch.Size(shape).numel()
        for gradient, scale in zip(gradients, scales, strict=True):
            for i, value in enumerate(gradient[name].flatten().tolist()):
                flat[i] += scale * value / count
        torch.testing.assert_close(result[name].flatten().tolist(), flat)
    # Fresh tensors, even for one gradient at scale 1: the parameter function hands them to the optimizer as they
    # are, and the inputs (views of a decoded payload) stay as they were.
    before = {name: g.clone() for name, g in gradients[0].items()}
    for name, out in aggregate(gradients[:1], [1.0]).items():
        assert out.untyped_storage().data_ptr() != gradients[0][name].untyped_storage().data_ptr()
        out.add_(1.0)
        torch.testing.assert_close(gradients[0][name], before[name])


def test_aggregate_rejects_mismatches() -> None:
    with pytest.raises(ValueError, match="nothing"):
        aggregate([], [])
    with pytest.raises(ValueError, match="scales"):
        aggregate([{"w": torch.zeros(1)}], [1.0, 1.0])
    with pytest.raises(ValueError, match="different parameters"):
        aggregate([{"w": torch.zeros(1)}, {"b": torch.zeros(1)}], [1.0, 1.0])


# --- the Stellaris rule ------------------------------------------------------------------------------------


def test_round_one_has_no_threshold_and_records_delta_max() -> None:
    state = AggregationState()
    record = decide_stellaris(state, _snapshot(10, [4], [9, 10]), d=0.96)
    assert record.decision is Decision.AGGREGATE and record.threshold is None
    assert (record.stalenesses, record.max_staleness, record.count) == ((6,), 6, 1)
    state = observe(state, record)
    assert state.delta_max == 6
    state = observe(state, decide_stellaris(state, _snapshot(11, [9, 10]), d=0.96))  # stalenesses 2, 1
    assert state.delta_max == 6
    state = next_round(state)
    assert state.round_k == 2 and not state.calibrating
    # after round 1 δ_max is fixed
    assert observe(state, decide_stellaris(state, _snapshot(30, [0]), d=1.0)).delta_max == 6


def test_threshold_admits_deferrs_and_flushes() -> None:
    # δ_max = 4, d = 0.5, k = 2: β = 4·0.25 = 1.0
    admitted = decide_stellaris(CALIBRATED, _snapshot(10, [10, 8], [10]), d=0.5)  # mean (0 + 2)/2 = 1 ≤ 1
    assert admitted.decision is Decision.AGGREGATE and admitted.count == 2
    assert (admitted.mean_staleness, admitted.max_staleness, admitted.threshold) == (1.0, 2, 1.0)
    deferred = decide_stellaris(CALIBRATED, _snapshot(10, [8, 8], [10]), d=0.5)  # mean 2 > 1
    assert deferred.decision is Decision.DEFER and deferred.count == 0 and not deferred.applies
    flushed = decide_stellaris(CALIBRATED, _snapshot(10, [8, 8]), d=0.5)  # nothing in flight: liveness
    assert flushed.decision is Decision.FLUSH and flushed.count == 2 and flushed.applies


def test_d_one_is_pure_asynchrony() -> None:
    # β_k = δ_max at every round: gradients as stale as under round 1's pure asynchrony aggregate on arrival
    for round_k in (2, 10, 100, 1000):
        state = AggregationState(round_k=round_k, delta_max=4)
        for queued in ([6], [10], [6, 8]):  # stalenesses 4, 0, (4 + 2)/2
            record = decide_stellaris(state, _snapshot(10, queued, [7, 9]), d=1.0)
            assert record.decision is Decision.AGGREGATE
    # whereas d = 0.96 at round 100 (β ≈ 0.067) holds the same stale gradient back
    state = AggregationState(round_k=100, delta_max=4)
    assert decide_stellaris(state, _snapshot(10, [6], [7, 9]), d=0.96).decision is Decision.DEFER


@pytest.mark.parametrize("round_k", [1, 2, 7])
def test_d_zero_is_full_synchrony(round_k: int) -> None:
    state = AggregationState(round_k=round_k, delta_max=None if round_k == 1 else 3)
    # even a fresh (δ = 0) gradient waits while any learner task of the round is in flight
    assert decide_stellaris(state, _snapshot(5, [5, 5], [5]), d=0.0).decision is Decision.DEFER
    record = decide_stellaris(state, _snapshot(5, [5, 5, 5]), d=0.0)
    assert record.decision is Decision.AGGREGATE and record.count == 3


def test_empty_queue_defers() -> None:
    for record in (
        decide_stellaris(CALIBRATED, _snapshot(3, []), d=0.96),
        decide_sync(CALIBRATED, _snapshot(3, [])),
        decide_async(CALIBRATED, _snapshot(3, [])),
        decide_softsync(CALIBRATED, _snapshot(3, []), k=2),
        decide_ssp(CALIBRATED, _snapshot(3, []), bound=1),
    ):
        assert record.decision is Decision.DEFER and record.count == 0 and record.mean_staleness == 0.0


# --- β's schedule over long runs ---------------------------------------------------------------------------


def test_bound_paper_is_eq3_literally() -> None:
    # δ_max = 4, d = 0.96, k = 10: 0.96^10 = 0.66483 → β = 2.65933
    assert staleness_bound(4, d=0.96, round_k=10, schedule=Schedule.PAPER) == pytest.approx(2.65933, abs=1e-5)
    # k = 200: 0.96^200 = 2.846e-4 → β = 0.0011384, below any mean staleness a concurrent learner can reach
    assert staleness_bound(4, d=0.96, round_k=200, schedule=Schedule.PAPER) == pytest.approx(0.0011384, abs=1e-7)
    # the horizon is ignored under PAPER
    beta = staleness_bound(4, d=0.96, round_k=10, schedule=Schedule.PAPER, horizon_rounds=500)
    assert beta == staleness_threshold(4, d=0.96, round_k=10)


def test_bound_horizon_measures_k_against_the_run() -> None:
    # horizon 500 rounds, paper 50: k = 100 → k_eff = 100·50/500 = 10 → β = 4·0.96^10 = 2.65933
    assert staleness_bound(4, d=0.96, round_k=100, schedule=Schedule.HORIZON, horizon_rounds=500) == pytest.approx(
        2.65933, abs=1e-5
    )
    # the last round, k = 500 → k_eff = 50: the paper's decay over its 50 rounds, 4·0.96^50 = 0.51954
    assert staleness_bound(4, d=0.96, round_k=500, schedule=Schedule.HORIZON, horizon_rounds=500) == pytest.approx(
        0.51954, abs=1e-5
    )
    # a horizon shorter than the paper's decays faster: horizon 25, k = 10 → k_eff = 20 → 4·0.96^20 = 1.76801
    assert staleness_bound(4, d=0.96, round_k=10, schedule=Schedule.HORIZON, horizon_rounds=25) == pytest.approx(
        1.76801, abs=1e-5
    )
    # paper_rounds is the knob: paper_rounds 100, horizon 500, k = 50 → k_eff = 10 → 2.65933
    beta = staleness_bound(4, d=0.96, round_k=50, schedule=Schedule.HORIZON, horizon_rounds=500, paper_rounds=100)
    assert beta == pytest.approx(2.65933, abs=1e-5)
    # no horizon known: PAPER
    assert staleness_bound(4, d=0.96, round_k=100, schedule=Schedule.HORIZON) == staleness_threshold(
        4, d=0.96, round_k=100
    )


def test_bound_floor_keeps_one_version_behind_admissible() -> None:
    # k = 200: max(4·0.96^200 = 0.0011384, min(1, 4) = 1) = 1
    assert staleness_bound(4, d=0.96, round_k=200, schedule=Schedule.FLOOR) == 1.0
    # early the Eq. 3 value is above the floor and stays: k = 10 → max(2.65933, 1) = 2.65933
    assert staleness_bound(4, d=0.96, round_k=10, schedule=Schedule.FLOOR) == pytest.approx(2.65933, abs=1e-5)
    # the floor is not capped at δ_max (a round 1 that started with little staleness must not lower it):
    # δ_max = 2, floor 3, k = 2 → max(2·0.96² = 1.8432, 3) = 3;  δ_max = 0, k = 200 → max(0, 1) = 1
    assert staleness_bound(2, d=0.96, round_k=2, schedule=Schedule.FLOOR, beta_floor=3.0) == 3.0
    assert staleness_bound(0, d=0.96, round_k=200, schedule=Schedule.FLOOR) == 1.0
    # d = 1 raises β to the floor too: max(δ_max = 2, 3) = 3;  PAPER ignores the floor: 2·0.96² = 1.8432
    assert staleness_bound(2, d=1.0, round_k=2, schedule=Schedule.FLOOR, beta_floor=3.0) == 3.0
    assert staleness_bound(2, d=0.96, round_k=2, schedule=Schedule.PAPER, beta_floor=3.0) == pytest.approx(1.8432)
    # other floors: 2 → max(0.0011384, 2) = 2;  0 → Eq. 3 itself
    assert staleness_bound(4, d=0.96, round_k=200, schedule=Schedule.FLOOR, beta_floor=2.0) == 2.0
    assert staleness_bound(4, d=0.96, round_k=200, schedule=Schedule.FLOOR, beta_floor=0.0) == pytest.approx(
        0.0011384, abs=1e-7
    )


def test_bound_horizon_floor_combines_both() -> None:
    # horizon 500: k = 100 → k_eff = 10 → max(2.65933, 1) = 2.65933;  k = 500 → k_eff = 50 → max(0.51954, 1) = 1
    for round_k, beta in ((100, 2.65933), (500, 1.0)):
        bound = staleness_bound(4, d=0.96, round_k=round_k, schedule=Schedule.HORIZON_FLOOR, horizon_rounds=500)
        assert bound == pytest.approx(beta, abs=1e-5)
    # no horizon: FLOOR
    assert staleness_bound(4, d=0.96, round_k=200, schedule=Schedule.HORIZON_FLOOR) == 1.0


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("horizon_rounds", [None, 10, 500])
def test_bound_d_zero_and_one_under_every_schedule(schedule: Schedule, horizon_rounds: int | None) -> None:
    # d = 1: β = δ_max at every round (pure asynchrony);  d = 0: β = 0 (full synchrony), no floor
    for round_k in (1, 2, 50, 1000):
        for d, beta in ((1.0, 4.0), (0.0, 0.0)):
            bound = staleness_bound(4, d=d, round_k=round_k, schedule=schedule, horizon_rounds=horizon_rounds)
            assert bound == beta


def test_bound_rejects_bad_parameters() -> None:
    # horizon_rounds, beta_floor: bounded by their declarations, where a job's config and plan enter
    with pytest.raises(ValidationError, match="greater than 0"):
        Plan(horizon_rounds=0)
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        StellarisConfig(beta_floor=-1.0)
    with pytest.raises(ValueError, match=r"^d: Input should be less than or equal to 1, got 1.5$"):
        staleness_bound(4, d=1.5, round_k=2, schedule=Schedule.HORIZON, horizon_rounds=10)
    with pytest.raises(ValueError, match=r"^d: Input should be greater than or equal to 0, got -0.5$"):
        staleness_bound(4, d=-0.5, round_k=2, schedule=Schedule.HORIZON, horizon_rounds=10)  # not a complex β
    with pytest.raises(ValueError, match="rounds count from 1"):
        staleness_bound(4, d=0.96, round_k=0, schedule=Schedule.FLOOR)
    with pytest.raises(ValueError, match="is not a valid Schedule"):
        staleness_bound(4, d=0.96, round_k=2, schedule="linear")  # type: ignore[arg-type]


def test_floor_admits_one_version_behind_where_paper_defers_or_flushes() -> None:
    # δ_max = 4, d = 0.96, round 200, queue stalenesses (1, 1): mean 1.0
    # PAPER: β = 0.0011384 < 1 → DEFER while a learner is in flight, FLUSH when none is;  FLOOR: β = 1 → AGGREGATE
    state = AggregationState(round_k=200, delta_max=4)
    in_flight, idle = _snapshot(10, [9, 9], [10]), _snapshot(10, [9, 9])
    assert decide_stellaris(state, in_flight, d=0.96).decision is Decision.DEFER
    assert decide_stellaris(state, idle, d=0.96, schedule=Schedule.PAPER).decision is Decision.FLUSH
    for snapshot in (in_flight, idle):
        record = decide_stellaris(state, snapshot, d=0.96, schedule=Schedule.FLOOR)
        assert record.decision is Decision.AGGREGATE and record.count == 2 and record.threshold == 1.0
    # HORIZON at 500 planned rounds: k_eff = 20 → β = 1.76801 ≥ 1 → AGGREGATE
    record = decide_stellaris(state, in_flight, d=0.96, schedule=Schedule.HORIZON, horizon_rounds=500)
    assert record.decision is Decision.AGGREGATE and record.threshold == pytest.approx(1.76801, abs=1e-5)
    # a mean staleness above the floor is still held back: stalenesses (2, 2), β = 1 → DEFER
    assert decide_stellaris(state, _snapshot(10, [8, 8], [10]), d=0.96, schedule=Schedule.FLOOR).decision is (
        Decision.DEFER
    )


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("round_k", [1, 2, 200])
def test_decide_d_zero_and_one_under_every_schedule(schedule: Schedule, round_k: int) -> None:
    state = AggregationState(round_k=round_k, delta_max=None if round_k == 1 else 4)
    rule = AggregationRule(schedule=schedule, horizon_rounds=500)
    # d = 0: full synchrony, even for fresh gradients and under the floor
    assert decide(replace(rule, d=0.0), state, _snapshot(5, [5, 5], [5])).decision is Decision.DEFER
    synced = decide(replace(rule, d=0.0), state, _snapshot(5, [5, 5, 5]))
    assert synced.decision is Decision.AGGREGATE and synced.count == 3 and synced.threshold == 0.0
    # d = 1: gradients 4 versions stale (= δ_max) aggregate on arrival
    assert decide(replace(rule, d=1.0), state, _snapshot(10, [6], [9])).decision is Decision.AGGREGATE


def test_decide_passes_the_schedule_from_the_rule() -> None:
    state, snapshot = AggregationState(round_k=200, delta_max=4), _snapshot(10, [9, 9], [10])
    rule = AggregationRule(schedule=Schedule.HORIZON_FLOOR, horizon_rounds=1000, paper_rounds=25, beta_floor=0.5)
    expected = decide_stellaris(
        state, snapshot, d=0.96, schedule=Schedule.HORIZON_FLOOR, horizon_rounds=1000, paper_rounds=25, beta_floor=0.5
    )
    assert decide(rule, state, snapshot) == expected
    # k_eff = 200·25/1000 = 5 → β = 4·0.96^5 = 3.26150
    assert expected.threshold == pytest.approx(3.26150, abs=1e-5)
    assert AggregationRule().schedule is Schedule.PAPER
    assert decide(AggregationRule(), state, snapshot).decision is Decision.DEFER


@pytest.mark.parametrize("schedule", list(Schedule))
def test_every_round_drains_under_every_schedule(schedule: Schedule) -> None:
    test_every_round_drains_its_queue(0, AggregationRule(schedule=schedule, horizon_rounds=4))


def test_config_and_plan_carry_the_schedule_into_the_rule() -> None:
    config = StellarisConfig(schedule=Schedule.HORIZON, beta_floor=0.5)
    rule = aggregation_rule(config, Plan(horizon_rounds=245))
    assert (rule.schedule, rule.horizon_rounds, rule.beta_floor, rule.paper_rounds) == (Schedule.HORIZON, 245, 0.5, 50)
    assert StellarisConfig.model_validate({"schedule": "floor"}).schedule is Schedule.FLOOR
    # a rule's defaults are the declarations' (the knobs, the config, a plan bounded by time only)
    assert aggregation_rule(StellarisConfig(), Plan()) == AggregationRule()


def test_the_plan_is_the_horizon_and_an_older_specs_horizon_moves_into_it() -> None:
    from contract.jobspec import JobSpec

    assert Plan.of(rounds=None, env_steps=500_000, train_batch_size=2048) == Plan(
        horizon_rounds=245, horizon_steps=500_000
    )
    assert Plan.of(rounds=10, env_steps=500_000, train_batch_size=2048).horizon_rounds == 10  # rounds win
    assert Plan.of(rounds=None, env_steps=None, train_batch_size=2048) == Plan()  # bounded by time only
    older = {"job": "j", "env_id": "Hopper-v5", "algo": {"algo": "ppo", "stellaris": {"horizon_rounds": 245}}}
    spec = JobSpec.model_validate(older)
    assert (spec.plan, spec.algo.stellaris) == (Plan(horizon_rounds=245), StellarisConfig())
    both = {**older, "plan": {"horizon_rounds": 9}}
    assert JobSpec.model_validate(both).plan.horizon_rounds == 9  # the plan's own wins


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("beta_floor", -0.5, "greater than or equal to 0"),
        ("horizon_rounds", 0, "Extra inputs are not permitted"),  # the plan's, not the section's
        ("schedule", "linear", "'paper', 'horizon', 'floor' or 'horizon_floor'"),
    ],
)
def test_config_rejects_bad_schedule_fields(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as error:
        StellarisConfig.model_validate({field: value})
    assert error.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("algo", ["ppo", "impact"])
@pytest.mark.parametrize("env_kind", ["mujoco", "atari"])
def test_presets_pick_the_schedule(algo: AlgoName, env_kind: EnvKind) -> None:
    assert preset("paper", algo, env_kind).stellaris.schedule is Schedule.PAPER
    fast = preset("fast", algo, env_kind).stellaris
    assert fast.model_copy(update={"truncation_form": "surrogate"}) == StellarisConfig(schedule=Schedule.HORIZON_FLOOR)


def test_job_overrides_merge_over_the_preset_schedule() -> None:
    def stellaris(preset_name: PresetName, env_id: str, **overrides: object) -> StellarisConfig:
        return resolve_algo("ppo", preset_name, env_id, {"stellaris": overrides}).stellaris

    # the fast preset's schedule survives overrides of other fields
    merged = stellaris("fast", "Hopper-v4", d=0.9, beta_floor=3.0)
    assert (merged.schedule, merged.d, merged.beta_floor) == (Schedule.HORIZON_FLOOR, 0.9, 3.0)
    assert stellaris("fast", "ALE/Pong-v5").schedule is Schedule.HORIZON_FLOOR
    # and can itself be overridden, by name
    assert stellaris("fast", "Hopper-v4", schedule="paper").schedule is Schedule.PAPER
    assert aggregation_rule(stellaris("paper", "Hopper-v4", schedule="floor", beta_floor=2.0), Plan()).beta_floor == 2.0


# --- baselines ---------------------------------------------------------------------------------------------


def test_sync_waits_for_the_whole_step() -> None:
    assert decide_sync(CALIBRATED, _snapshot(4, [4, 4], [4]), expected=3).decision is Decision.DEFER
    assert decide_sync(CALIBRATED, _snapshot(4, [4, 4, 4]), expected=3).decision is Decision.AGGREGATE
    # a learner was lost: nothing in flight, two of three arrived → flushed
    assert decide_sync(CALIBRATED, _snapshot(4, [4, 4]), expected=3).decision is Decision.FLUSH
    # without an expected count: all tasks known to the snapshot
    assert decide_sync(CALIBRATED, _snapshot(4, [4], [4])).decision is Decision.DEFER
    assert decide_sync(CALIBRATED, _snapshot(4, [4, 4])).decision is Decision.AGGREGATE


def test_async_applies_each_gradient_on_its_own_oldest_first() -> None:
    record = decide_async(CALIBRATED, _snapshot(9, [1, 5], [8, 9]))
    assert record.decision is Decision.AGGREGATE and record.count == 1 and record.stalenesses == (8, 4)


def test_softsync_every_k() -> None:
    assert decide_softsync(CALIBRATED, _snapshot(5, [5, 4], [5]), k=3).decision is Decision.DEFER
    record = decide_softsync(CALIBRATED, _snapshot(5, [3, 4, 5, 5], [5]), k=3)
    assert record.decision is Decision.AGGREGATE and record.count == 3  # the three oldest
    flushed = decide_softsync(CALIBRATED, _snapshot(5, [4, 5]), k=3)
    assert flushed.decision is Decision.FLUSH and flushed.count == 2


def test_ssp_bound() -> None:
    # v = 10, s = 2: after the update v = 11; a learner on base 9 would be 2 behind (ok), on base 8, 3 (not ok)
    assert decide_ssp(CALIBRATED, _snapshot(10, [10], [9, 10]), bound=2).decision is Decision.AGGREGATE
    record = decide_ssp(CALIBRATED, _snapshot(10, [10], [8, 10]), bound=2)
    assert record.decision is Decision.DEFER and record.threshold == 2.0
    assert decide_ssp(CALIBRATED, _snapshot(10, [7]), bound=2).decision is Decision.AGGREGATE
    # s = 0 makes every update wait for all in-flight learners
    assert decide_ssp(CALIBRATED, _snapshot(10, [10], [10]), bound=0).decision is Decision.DEFER


def test_decide_dispatches_and_scales() -> None:
    snapshot = _snapshot(10, [8, 10], [10])
    assert decide(AggregationRule(d=0.5), CALIBRATED, snapshot) == decide_stellaris(CALIBRATED, snapshot, d=0.5)
    assert decide(AggregationRule(rule=Rule.SYNC), CALIBRATED, snapshot, sync_expected=2).decision is Decision.AGGREGATE
    assert decide(AggregationRule(rule=Rule.ASYNC), CALIBRATED, snapshot).rule is Rule.ASYNC
    assert decide(AggregationRule(rule=Rule.SOFTSYNC, softsync_k=3), CALIBRATED, snapshot).decision is Decision.DEFER
    assert decide(AggregationRule(rule=Rule.SSP, ssp_bound=0), CALIBRATED, snapshot).decision is Decision.DEFER
    # Eq. 4 scales only under the Stellaris rule
    assert gradient_scales(AggregationRule(v=3.0), [0, 8]) == pytest.approx([1.0, 0.5])
    assert gradient_scales(AggregationRule(rule=Rule.ASYNC), [0, 8]) == [1.0, 1.0]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "rule",
    [
        AggregationRule(),
        AggregationRule(d=0.0),
        AggregationRule(d=1.0),
        AggregationRule(d=0.5),
        AggregationRule(rule=Rule.SYNC),
        AggregationRule(rule=Rule.ASYNC),
        AggregationRule(rule=Rule.SOFTSYNC, softsync_k=3),
        AggregationRule(rule=Rule.SSP, ssp_bound=1),
    ],
)
def test_every_round_drains_its_queue(seed: int, rule: AggregationRule) -> None:
    """Liveness: learner tasks finish in random order, up to 4 at a time; each round ends with an empty queue."""
    rng = random.Random(seed)
    state, version = AggregationState(), 0
    for _ in range(6):
        pending, in_flight, queue = 10, [], []
        while pending or in_flight or queue:
            while pending and len(in_flight) < 4:
                in_flight.append(version)
                pending -= 1
            if in_flight:
                queue.append(in_flight.pop(rng.randrange(len(in_flight))))
            record = decide(rule, state, QueueSnapshot(version, tuple(queue), tuple(in_flight)))
            if record.applies:
                del queue[: record.count]
                version += 1
                state = observe(state, record)
            elif not in_flight and not pending:
                pytest.fail(f"{rule} deferred with nothing in flight: {record}")
        state = next_round(state)
    assert state.round_k == 7 and state.delta_max is not None


def test_optimizer_step_gradients_one_mean_or_one_step_each() -> None:
    """Hand-computed: g1 = 2, g2 = 4, scales 1 and 1/4: one step of (2·1 + 4·0.25)/2 = 1.5, or steps of 2 then 1."""
    grads = [{"w": torch.tensor([2.0])}, {"w": torch.tensor([4.0])}]
    [one] = optimizer_step_gradients(grads, [1.0, 0.25])
    assert one["w"].tolist() == [1.5]
    each = optimizer_step_gradients(grads, [1.0, 0.25], "each")
    assert [g["w"].tolist() for g in each] == [[2.0], [1.0]]
    with pytest.raises(ValueError, match="optimizer_steps"):
        optimizer_step_gradients(grads, [1.0, 0.25], "some")


def test_the_rules_are_declared_once_with_the_knobs() -> None:
    from contract import knobs

    assert Rule is knobs.Rule and [r.value for r in Rule] == ["stellaris", "sync", "async", "softsync", "ssp"]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (AggregationRule(rule=Rule.STELLARIS, d=0.96), True),
        (AggregationRule(rule=Rule.STELLARIS, d=1.0), True),
        (AggregationRule(rule=Rule.ASYNC), True),
        (AggregationRule(rule=Rule.STELLARIS, d=0.0), False),  # waits for the round's tasks
        (AggregationRule(rule=Rule.SYNC), False),
        (AggregationRule(rule=Rule.SOFTSYNC), False),
        (AggregationRule(rule=Rule.SSP), False),
    ],
)
def test_which_rules_apply_from_the_queue_alone(rule: AggregationRule, expected: bool) -> None:
    assert applies_from_queue_alone(rule) is expected


@given(
    d=st.sampled_from([0.5, 0.96, 1.0]),
    schedule=st.sampled_from(list(Schedule)),
    round_k=st.integers(1, 300),
    delta_max=st.one_of(st.none(), st.integers(0, 12)),
    current=st.integers(0, 40),
    queued=st.lists(st.integers(0, 40), max_size=8),
    in_flight=st.lists(st.integers(0, 40), max_size=4),
    asynchronous=st.booleans(),
)
def test_a_decision_to_apply_from_the_queue_alone_is_the_one_taken_whatever_is_in_flight(
    d: float,
    schedule: Schedule,
    round_k: int,
    delta_max: int | None,
    current: int,
    queued: list[int],
    in_flight: list[int],
    asynchronous: bool,
) -> None:
    """What the parameter function relies on to skip its look at work in flight: where the rule applies with "at
    least one in flight, versions unknown", it applies the same gradients with any work in flight."""
    rule = AggregationRule(
        rule=Rule.ASYNC if asynchronous else Rule.STELLARIS, d=d, schedule=schedule, horizon_rounds=245
    )
    state = AggregationState(round_k=round_k, delta_max=None if round_k == 1 else delta_max)
    base = tuple(min(v, current) for v in queued)
    blind = decide(rule, state, QueueSnapshot(current, base, (current,)))
    seen = decide(rule, state, QueueSnapshot(current, base, tuple(min(v, current) for v in in_flight)))
    if blind.applies:
        assert seen == blind
    else:
        assert not seen.applies or not in_flight  # only a flush (nothing in flight) can apply where it deferred


def test_max_aggregate_caps_each_update_to_the_oldest_gradients() -> None:
    """With a cap of 2, an admitted queue of 5 applies its 2 oldest (the rule decides again on the rest), a flush
    too; 0 applies the whole queue, as the paper."""
    rule = AggregationRule(rule=Rule.STELLARIS, d=0.96, max_aggregate=2)
    queue = _snapshot(10, [9, 9, 8, 10, 10], in_flight=[10])
    capped = decide(rule, CALIBRATED, queue)
    assert capped.decision is Decision.AGGREGATE and capped.count == 2 and capped.stalenesses[:2] == (1, 1)
    assert decide(replace(rule, max_aggregate=0), CALIBRATED, queue).count == 5
    flush = decide(rule, CALIBRATED, _snapshot(10, [0, 0, 0]))  # mean staleness 10 > β, nothing in flight
    assert flush.decision is Decision.FLUSH and flush.count == 2
    assert decide(rule, AggregationState(round_k=1), queue).count == 2  # round 1's calibration too
    assert aggregation_rule(StellarisConfig(max_aggregate=8), Plan()).max_aggregate == 8
    with pytest.raises(ValidationError, match="max_aggregate"):
        StellarisConfig(max_aggregate=-1)
