"""Staleness by parameter distance (Gap-aware): the penalty, the running step and the kept versions, against
hand-computed numbers; and the parameter function's update dividing a stale gradient by its gap."""

from __future__ import annotations

import pytest
import torch

from contract.algo_config import StellarisConfig
from functions.algos.gap_aware import ParameterGaps, gap_penalties, update_step


def test_the_penalty_counts_typical_steps_moved_and_is_never_below_one() -> None:
    current = [torch.tensor([1.0, 0.5, -2.0, 0.3])]
    base = [torch.tensor([0.0, 0.45, -2.0, 0.0])]
    step = [torch.tensor([0.25, 0.1, 0.0, 0.1])]
    # |Δ| / C = 1.0/0.25 = 4; 0.05/0.1 = 0.5 -> 1; 0 (a parameter that never moved) -> 1; 0.3/0.1 = 3
    torch.testing.assert_close(gap_penalties(current, base, step)[0], torch.tensor([4.0, 1.0, 1.0, 3.0]))


def test_the_step_is_the_first_move_then_a_running_mean() -> None:
    first = update_step(None, [torch.tensor([0.0, 1.0])], [torch.tensor([0.5, 0.8])])
    torch.testing.assert_close(first[0], torch.tensor([0.5, 0.2]))
    # 0.9·0.5 + 0.1·|2.0 − 0.5| = 0.6; 0.9·0.2 + 0.1·|0.8 − 0.8| = 0.18
    after = update_step(first, [torch.tensor([0.5, 0.8])], [torch.tensor([2.0, 0.8])])
    torch.testing.assert_close(after[0], torch.tensor([0.6, 0.18]))


def test_versions_are_kept_up_to_the_bound_and_an_unkept_base_has_no_gap() -> None:
    gaps = ParameterGaps(keep=3)
    param = torch.nn.Parameter(torch.tensor([0.0]))
    for version, value in enumerate((0.0, 1.0, 3.0, 3.5, 4.0), start=1):
        with torch.no_grad():
            param.fill_(value)
        gaps.record(version, [param])
    assert list(gaps.history) == [3, 4, 5] and gaps.newest() == 5
    assert gaps.penalties(2, [param]) is None  # retired past the bound: the caller falls back to δ
    # C: 1.0, then 0.9·1 + 0.1·2 = 1.1, 0.9·1.1 + 0.1·0.5 = 1.04, 0.9·1.04 + 0.1·0.5 = 0.986
    assert gaps.step is not None
    torch.testing.assert_close(gaps.step[0], torch.tensor([0.986]))
    penalty = gaps.penalties(3, [param])  # |4.0 − 3.0| / 0.986
    assert penalty is not None
    torch.testing.assert_close(penalty[0], torch.tensor([1.0 / 0.986]))
    assert ParameterGaps(keep=3).penalties(1, [param]) is None  # nothing kept: no gap


def test_a_copy_is_kept_not_the_live_parameter() -> None:
    gaps, param = ParameterGaps(keep=4), torch.nn.Parameter(torch.tensor([1.0]))
    gaps.record(1, [param])
    with torch.no_grad():
        param.add_(5.0)
    assert gaps.history[1][0].item() == 1.0


def test_the_penalty_and_its_history_are_configured_and_bounded() -> None:
    assert StellarisConfig().staleness_penalty == "version" and StellarisConfig().gap_history == 16
    assert StellarisConfig(staleness_penalty="distance", gap_history=64).gap_history == 64
    with pytest.raises(ValueError, match="gap_history"):
        StellarisConfig(gap_history=1000)
    with pytest.raises(ValueError, match="staleness_penalty"):
        StellarisConfig(staleness_penalty="gap")  # type: ignore[arg-type]


def test_the_update_divides_a_kept_base_by_its_gap_and_scales_an_unkept_one_by_its_version_count() -> None:
    """Two gradients in one aggregation under SGD: one on version 3 (kept: divided by its gap, no 1/δ^(1/v)), one on
    version 1 (not kept: 1/δ^(1/v), δ = 4); θ moves by lr times their mean, and version 6 is kept after."""
    from gymnasium import spaces

    from contract.jobspec import Plan, resolve_algo
    from contract.knobs import Rule
    from contract.packed import PACKED
    from contract.records import GradientMeta, GradientRecord
    from functions.algos.stellaris import Decision, DecisionRecord, aggregation_rule
    from functions.model.flat_params import flat_params, flatten_parameters
    from functions.model.policies import build_policy
    from functions.parameter.aggregation import update
    from functions.runtime.context import WarmModel

    overrides = {"lr_schedule": "constant", "stellaris": {"staleness_penalty": "distance"}}
    cfg = resolve_algo("ppo", "fast", "Hopper-v5", overrides)
    box = spaces.Box(-1.0, 1.0, (3,))
    policy = build_policy(box, spaces.Box(-1.0, 1.0, (1,)), hidden=(4,))
    flatten_parameters(policy)
    packed = flat_params(policy)
    assert packed is not None
    flat = packed.flat
    model = WarmModel(5, policy, torch.optim.SGD([flat], lr=cfg.lr))
    theta = flat.detach().clone()
    d = torch.linspace(0.1, 1.0, theta.numel())
    model.gaps = ParameterGaps(keep=16)
    for version, behind in ((3, 1.5), (4, 0.5), (5, 0.0)):
        model.gaps.record(version, [theta - behind * d])
    # C = 0.9·|d| + 0.1·0.5·|d| = 0.95·|d|; version 3's gap: 1.5·|d| / (0.95·|d|) = 1.5789...
    g = torch.ones_like(theta)
    records = [GradientRecord(GradientMeta("l", base, f"t{base}", 2), {PACKED: g.clone()}) for base in (3, 1)]
    record = DecisionRecord(Rule.STELLARIS, Decision.AGGREGATE, 2, 2, (2, 4), 3.0, 4)
    update(model, cfg, Plan(), aggregation_rule(cfg.stellaris, Plan()), record, records, torch.device("cpu"))
    expected = theta - cfg.lr * (g / (1.5 / 0.95) + g * 4 ** (-1 / cfg.stellaris.v)) / 2
    torch.testing.assert_close(flat.detach(), expected)
    assert model.gaps.newest() == 6
