"""V-trace against hand arithmetic and the closed-form sum of IMPALA Eq. 1."""

from __future__ import annotations

import math

import pytest
import torch

from functions.algos.vtrace import vtrace


def _two_steps() -> dict[str, torch.Tensor]:
    # π/μ = 0.5 at t = 0 and 2.0 at t = 1
    return {
        "behaviour_log_probs": torch.log(torch.tensor([0.4, 0.2], dtype=torch.float64)),
        "target_log_probs": torch.log(torch.tensor([0.2, 0.4], dtype=torch.float64)),
        "rewards": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "values": torch.tensor([0.0, 1.0], dtype=torch.float64),
        "bootstrap_value": torch.tensor(3.0, dtype=torch.float64),
        "discounts": torch.tensor([0.9, 0.9], dtype=torch.float64),
    }


def test_hand_computed_two_steps() -> None:
    # ρ = min(1, [0.5, 2.0]) = [0.5, 1.0], c = [0.5, 1.0]; V(x_{t+1}) = [1, 3]
    # δ0 = 0.5·(1 + 0.9·1 − 0) = 0.95;  δ1 = 1.0·(2 + 0.9·3 − 1) = 3.7
    # v1 = 1 + 3.7 = 4.7;  v0 = 0 + 0.95 + 0.9·0.5·3.7 = 2.615
    # A0 = 0.5·(1 + 0.9·4.7 − 0) = 2.615;  A1 = 1.0·(2 + 0.9·3 − 1) = 3.7
    vs, advantages = vtrace(**_two_steps())
    torch.testing.assert_close(vs, torch.tensor([2.615, 4.7], dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor([2.615, 3.7], dtype=torch.float64))


def test_is_weights_replace_rho_in_targets_and_advantages() -> None:
    # R' = [0.25, 0.5] replaces ρ; c stays [0.5, 1.0]
    # δ0 = 0.25·1.9 = 0.475;  δ1 = 0.5·3.7 = 1.85;  v1 = 2.85;  v0 = 0.475 + 0.9·0.5·1.85 = 1.3075
    # A0 = 0.25·(1 + 0.9·2.85) = 0.89125;  A1 = 0.5·(2 + 0.9·3 − 1) = 1.85
    is_weights = torch.tensor([0.25, 0.5], dtype=torch.float64)
    vs, advantages = vtrace(**_two_steps(), is_weights=is_weights)
    torch.testing.assert_close(vs, torch.tensor([1.3075, 2.85], dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor([0.89125, 1.85], dtype=torch.float64))


def test_on_policy_targets_are_discounted_returns() -> None:
    inputs = _two_steps()
    inputs["target_log_probs"] = inputs["behaviour_log_probs"].clone()
    # G1 = 2 + 0.9·3 = 4.7;  G0 = 1 + 0.9·4.7 = 5.23
    vs, _ = vtrace(**inputs)
    torch.testing.assert_close(vs, torch.tensor([5.23, 4.7], dtype=torch.float64))


def _slow_vtrace(
    log_rhos: list[float],
    rewards: list[float],
    values: list[float],
    bootstrap: float,
    discounts: list[float],
    rho_bar: float,
    c_bar: float,
    weights: list[float] | None,
) -> tuple[list[float], list[float]]:
    """v_s = V(x_s) + Σ_{t≥s} (Π_{i=s}^{t−1} γ_i·c_i)·δ_t V (IMPALA Eq. 1), written as the explicit sum."""
    horizon = len(rewards)
    values_ext = [*values, bootstrap]
    rhos = [min(rho_bar, math.exp(x)) for x in log_rhos] if weights is None else weights
    cs = [min(c_bar, math.exp(x)) for x in log_rhos]
    deltas = [rhos[t] * (rewards[t] + discounts[t] * values_ext[t + 1] - values_ext[t]) for t in range(horizon)]
    vs = []
    for s in range(horizon):
        total = values[s]
        for t in range(s, horizon):
            coefficient = 1.0
            for i in range(s, t):
                coefficient *= discounts[i] * cs[i]
            total += coefficient * deltas[t]
        vs.append(total)
    vs_ext = [*vs, bootstrap]
    advantages = [rhos[s] * (rewards[s] + discounts[s] * vs_ext[s + 1] - values[s]) for s in range(horizon)]
    return vs, advantages


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(1,), (6,), (12, 1), (12, 4)])
@pytest.mark.parametrize(("rho_bar", "c_bar", "use_weights"), [(1.0, 1.0, False), (2.0, 0.7, False), (1.0, 1.0, True)])
def test_matches_slow_reference(
    seed: int, shape: tuple[int, ...], rho_bar: float, c_bar: float, use_weights: bool
) -> None:
    generator = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(shape, generator=generator, dtype=torch.float64) * 2
    target = -torch.rand(shape, generator=generator, dtype=torch.float64) * 2
    rewards = torch.randn(shape, generator=generator, dtype=torch.float64)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    bootstrap = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
    discounts = 0.95 * (torch.rand(shape, generator=generator) > 0.2).to(torch.float64)
    weights = torch.rand(shape, generator=generator, dtype=torch.float64) if use_weights else None

    vs, advantages = vtrace(
        behaviour, target, rewards, values, bootstrap, discounts, rho_bar=rho_bar, c_bar=c_bar, is_weights=weights
    )

    def column(x: torch.Tensor, n: int) -> list:
        return (x[:, n] if x.dim() == 2 else x).tolist()

    for n in range(shape[1] if len(shape) == 2 else 1):
        expected_vs, expected_advantages = _slow_vtrace(
            column(target - behaviour, n),
            column(rewards, n),
            column(values, n),
            (bootstrap[n] if bootstrap.dim() == 1 else bootstrap).item(),
            column(discounts, n),
            rho_bar,
            c_bar,
            column(weights, n) if weights is not None else None,
        )
        torch.testing.assert_close(column(vs, n), expected_vs)
        torch.testing.assert_close(column(advantages, n), expected_advantages)


def test_outputs_carry_no_gradient() -> None:
    inputs = _two_steps()
    inputs["values"].requires_grad_(True)
    inputs["target_log_probs"].requires_grad_(True)
    vs, advantages = vtrace(**inputs)
    assert not vs.requires_grad and not advantages.requires_grad
