"""GAE against hand arithmetic and a slow per-env, per-step loop written straight from the definition."""

from __future__ import annotations

import pytest
import torch

from functions.algos.gae import gae

GAMMA, LAM = 0.9, 0.8


def _three_steps(**flags: list[float]) -> tuple[torch.Tensor, ...]:
    rewards = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    values = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    terminations = torch.tensor(flags.get("terminations", [0.0, 0.0, 0.0]), dtype=torch.float64)
    truncations = torch.tensor(flags.get("truncations", [0.0, 0.0, 0.0]), dtype=torch.float64)
    return rewards, values, torch.tensor(2.0, dtype=torch.float64), terminations, truncations


def test_hand_computed_three_steps() -> None:
    # γλ = 0.72
    # δ0 = 1 + 0.9·1.0 − 0.5 = 1.4;  δ1 = 2 + 0.9·1.5 − 1.0 = 2.35;  δ2 = 3 + 0.9·2.0 − 1.5 = 3.3
    # A2 = 3.3;  A1 = 2.35 + 0.72·3.3 = 4.726;  A0 = 1.4 + 0.72·4.726 = 4.80272
    # returns = A + V = [5.30272, 5.726, 4.8]
    advantages, returns = gae(*_three_steps(), gamma=GAMMA, lam=LAM)
    torch.testing.assert_close(advantages, torch.tensor([4.80272, 4.726, 3.3], dtype=torch.float64))
    torch.testing.assert_close(returns, torch.tensor([5.30272, 5.726, 4.8], dtype=torch.float64))


def test_termination_stops_bootstrap_and_recursion() -> None:
    # step 1 ends in a terminal state: δ1 = 2 + 0 − 1.0 = 1.0 and A1 does not see A2.
    # A2 = 3.3 (next episode);  A1 = 1.0;  A0 = 1.4 + 0.72·1.0 = 2.12
    advantages, _ = gae(*_three_steps(terminations=[0.0, 1.0, 0.0]), gamma=GAMMA, lam=LAM)
    torch.testing.assert_close(advantages, torch.tensor([2.12, 1.0, 3.3], dtype=torch.float64))


def test_truncation_bootstraps_from_final_observation_value() -> None:
    # step 1 hits the time limit; V(final obs) = 5.0:  δ1 = 2 + 0.9·5.0 − 1.0 = 5.5, A1 = 5.5 (no carry)
    # A0 = 1.4 + 0.72·5.5 = 5.36;  A2 = 3.3
    truncation_values = torch.tensor([0.0, 5.0, 0.0], dtype=torch.float64)
    advantages, _ = gae(
        *_three_steps(truncations=[0.0, 1.0, 0.0]), gamma=GAMMA, lam=LAM, truncation_values=truncation_values
    )
    torch.testing.assert_close(advantages, torch.tensor([5.36, 5.5, 3.3], dtype=torch.float64))


def test_truncation_without_final_values_does_not_bootstrap() -> None:
    # same as a termination at step 1
    advantages, _ = gae(*_three_steps(truncations=[0.0, 1.0, 0.0]), gamma=GAMMA, lam=LAM)
    torch.testing.assert_close(advantages, torch.tensor([2.12, 1.0, 3.3], dtype=torch.float64))


def test_terminated_and_truncated_counts_as_terminated() -> None:
    truncation_values = torch.tensor([9.0, 9.0, 9.0], dtype=torch.float64)
    flags = {"terminations": [0.0, 1.0, 0.0], "truncations": [0.0, 1.0, 0.0]}
    advantages, _ = gae(*_three_steps(**flags), gamma=GAMMA, lam=LAM, truncation_values=truncation_values)
    torch.testing.assert_close(advantages, torch.tensor([2.12, 1.0, 3.3], dtype=torch.float64))


def test_truncation_at_last_step_ignores_bootstrap_value() -> None:
    # δ2 = 3 + 0.9·4.0 − 1.5 = 5.1 instead of 3.3
    truncation_values = torch.tensor([0.0, 0.0, 4.0], dtype=torch.float64)
    advantages, _ = gae(
        *_three_steps(truncations=[0.0, 0.0, 1.0]), gamma=GAMMA, lam=LAM, truncation_values=truncation_values
    )
    assert advantages[2].item() == pytest.approx(5.1)


def _slow_gae(
    rewards: list[float],
    values: list[float],
    bootstrap: float,
    terms: list[bool],
    truncs: list[bool],
    final_values: list[float] | None,
    gamma: float,
    lam: float,
) -> list[float]:
    """A_t = Σ_l (γλ)^l δ_{t+l} summed forward until the episode ends, one env at a time."""
    horizon = len(rewards)
    deltas = []
    for t in range(horizon):
        if terms[t]:
            next_value = 0.0
        elif truncs[t]:
            next_value = final_values[t] if final_values is not None else 0.0
        else:
            next_value = values[t + 1] if t + 1 < horizon else bootstrap
        deltas.append(rewards[t] + gamma * next_value - values[t])
    advantages = []
    for t in range(horizon):
        total, weight = 0.0, 1.0
        for u in range(t, horizon):
            total += weight * deltas[u]
            if terms[u] or truncs[u]:
                break
            weight *= gamma * lam
        advantages.append(total)
    return advantages


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(1,), (7,), (16, 1), (16, 5), (33, 3)])
@pytest.mark.parametrize("with_final_values", [False, True])
def test_matches_slow_reference(seed: int, shape: tuple[int, ...], with_final_values: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(shape, generator=generator, dtype=torch.float64)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    bootstrap = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
    terminations = torch.rand(shape, generator=generator) < 0.15
    truncations = torch.rand(shape, generator=generator) < 0.15
    final_values = torch.randn(shape, generator=generator, dtype=torch.float64) if with_final_values else None
    gamma, lam = 0.97, 0.9

    advantages, returns = gae(
        rewards, values, bootstrap, terminations, truncations, gamma=gamma, lam=lam, truncation_values=final_values
    )

    columns = shape[1] if len(shape) == 2 else 1

    def column(x: torch.Tensor, n: int) -> list:
        return (x[:, n] if x.dim() == 2 else x).tolist()

    for n in range(columns):
        expected = _slow_gae(
            column(rewards, n),
            column(values, n),
            (bootstrap[n] if bootstrap.dim() == 1 else bootstrap).item(),
            column(terminations, n),
            column(truncations, n),
            column(final_values, n) if final_values is not None else None,
            gamma,
            lam,
        )
        torch.testing.assert_close(column(advantages, n), expected)
    torch.testing.assert_close(returns, advantages + values)


def test_lambda_one_gives_discounted_returns_and_lambda_zero_td() -> None:
    rewards, values, bootstrap, terms, truncs = _three_steps()
    # λ = 1: returns are Monte Carlo with bootstrap: G2 = 3 + 0.9·2 = 4.8, G1 = 2 + 0.9·4.8 = 6.32,
    # G0 = 1 + 0.9·6.32 = 6.688
    _, returns = gae(rewards, values, bootstrap, terms, truncs, gamma=0.9, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([6.688, 6.32, 4.8], dtype=torch.float64))
    # λ = 0: advantages are the one-step TD errors δ_t
    advantages, _ = gae(rewards, values, bootstrap, terms, truncs, gamma=0.9, lam=0.0)
    torch.testing.assert_close(advantages, torch.tensor([1.4, 2.35, 3.3], dtype=torch.float64))


def test_no_gradient_and_shape_checks() -> None:
    rewards, values, bootstrap, terms, truncs = _three_steps()
    values.requires_grad_(True)
    advantages, returns = gae(rewards, values, bootstrap, terms, truncs, gamma=GAMMA, lam=LAM)
    assert not advantages.requires_grad and not returns.requires_grad
    with pytest.raises(ValueError, match="bootstrap_value"):
        gae(rewards, values, torch.zeros(3), terms, truncs, gamma=GAMMA, lam=LAM)
    with pytest.raises(ValueError, match="differ in shape"):
        gae(rewards, values[:2], bootstrap, terms, truncs, gamma=GAMMA, lam=LAM)
