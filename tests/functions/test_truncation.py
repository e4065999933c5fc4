"""Paper Eq. 2 truncation against hand numbers, its edges, a slow reference and the original code's formula."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

from functions.algos.stellaris import truncate_ratios, truncated_is_weight, truncation_stats
from functions.learner.learn import is_weights
from functions.model.policies import build_policy


def _log(*probabilities: float) -> torch.Tensor:
    return torch.log(torch.tensor(probabilities, dtype=torch.float64))


def test_hand_computed_weights() -> None:
    # μ(a|s) = [0.4, 0.4, 0.5]
    # own π_θ = [0.5, 0.3, 0.6]        → ratios [1.25, 0.75, 1.2]
    # other 1 = [0.2, 0.6, 0.9]        → ratios [0.5, 1.5, 1.8]
    # other 2 = [0.6, 0.36, 0.75]      → ratios [1.5, 0.9, 1.5]
    # min over the three               → [0.5, 0.75, 1.2]; R' = min(|·|, 1) = [0.5, 0.75, 1.0]
    behaviour = _log(0.4, 0.4, 0.5)
    own = _log(0.5, 0.3, 0.6)
    others = torch.stack([_log(0.2, 0.6, 0.9), _log(0.6, 0.36, 0.75)])
    weights = truncated_is_weight(own, others, behaviour, rho=1.0)
    torch.testing.assert_close(weights, torch.tensor([0.5, 0.75, 1.0], dtype=torch.float64))

    stats = truncation_stats(own, others, behaviour, rho=1.0)
    # only sample 2 (min ratio 1.2 > 1) is truncated; mean R' = 2.25/3 = 0.75
    assert stats.fraction_truncated == pytest.approx(1 / 3)
    assert stats.mean_weight == pytest.approx(0.75)


def test_own_policy_is_part_of_the_set() -> None:
    # others all above the own ratio: R' follows the learner's own ratio 0.8
    behaviour = _log(0.5)
    weights = truncated_is_weight(_log(0.4), torch.stack([_log(0.45), _log(0.49)]), behaviour, rho=1.0)
    torch.testing.assert_close(weights, torch.tensor([0.8], dtype=torch.float64))


def test_no_other_learners_is_plain_truncated_importance_sampling() -> None:
    behaviour = _log(0.5, 0.5)
    weights = truncated_is_weight(_log(0.25, 1.0), torch.empty(0, 2, dtype=torch.float64), behaviour, rho=1.0)
    torch.testing.assert_close(weights, torch.tensor([0.5, 1.0], dtype=torch.float64))  # min(r, ρ)


def test_ratio_exactly_rho_is_not_truncated() -> None:
    # all policies equal μ: every ratio is exactly exp(0) = 1 = ρ → weight 1, nothing counted as truncated
    behaviour = _log(0.3, 0.7)
    stats = truncation_stats(behaviour.clone(), torch.stack([behaviour.clone()]), behaviour, rho=1.0)
    assert stats.fraction_truncated == 0.0
    assert stats.mean_weight == 1.0
    # with ρ = 2 a ratio of exactly 2 is not truncated either, and one of 2.5 is
    stats = truncation_stats(_log(0.6, 0.75), torch.empty(0, 2, dtype=torch.float64), _log(0.3, 0.3), rho=2.0)
    assert stats.fraction_truncated == 0.5
    torch.testing.assert_close(
        truncated_is_weight(_log(0.6, 0.75), torch.empty(0, 2, dtype=torch.float64), _log(0.3, 0.3), rho=2.0),
        torch.tensor([2.0, 2.0], dtype=torch.float64),
    )


def test_absolute_value_is_taken_of_the_minimum() -> None:
    # Eq. 2 is |min_i r_i|, not min_i |r_i|: with a (signed) ratio set {−3, 0.5},
    # |min(−3, 0.5)| = 3 → min(3, 1) = 1, whereas min(|−3|, |0.5|) = 0.5.
    ratios = torch.tensor([[-3.0], [0.5]])
    torch.testing.assert_close(truncate_ratios(ratios, rho=1.0), torch.tensor([1.0]))
    # from probabilities the ratios are positive, so |·| never makes a weight negative, even at underflow
    weight = truncated_is_weight(torch.tensor([-800.0]), torch.tensor([[-1.0]]), torch.tensor([-0.5]), rho=1.0)
    assert weight.item() == 0.0 and not math.copysign(1.0, weight.item()) < 0


def _original_authors_weight(own_ratio: float, other_ratios: list[float], rho: float) -> float:
    """What the original Stellaris code computes: min(r_own, max(min_i r_i, ρ)) — not Eq. 2."""
    return min(own_ratio, max(min([own_ratio, *other_ratios]), rho))


def test_differs_from_original_authors_formula() -> None:
    # r_own = 0.8, another learner's r = 0.5, ρ = 1:
    # Eq. 2: min(|min(0.8, 0.5)|, 1) = 0.5;  original code: min(0.8, max(0.5, 1)) = 0.8
    ours = truncated_is_weight(_log(0.4), torch.stack([_log(0.25)]), _log(0.5), rho=1.0)
    assert ours.item() == pytest.approx(0.5)
    assert _original_authors_weight(0.8, [0.5], 1.0) == pytest.approx(0.8)
    # and above ρ the original lets r_own = 1.5 through untruncated; Eq. 2 caps it at ρ
    ours = truncated_is_weight(_log(0.75), torch.stack([_log(0.9)]), _log(0.5), rho=1.0)
    assert ours.item() == pytest.approx(1.0)
    assert _original_authors_weight(1.5, [1.8], 1.0) == pytest.approx(1.5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("others", "batch"), [(0, 5), (1, 8), (3, 16), (7, 4)])
@pytest.mark.parametrize("rho", [0.5, 1.0, 2.0])
def test_matches_slow_reference(seed: int, others: int, batch: int, rho: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(batch, generator=generator, dtype=torch.float64) * 2
    own = -torch.rand(batch, generator=generator, dtype=torch.float64) * 2
    other = -torch.rand(others, batch, generator=generator, dtype=torch.float64) * 2

    weights = truncated_is_weight(own, other, behaviour, rho=rho)
    stats = truncation_stats(own, other, behaviour, rho=rho)

    expected, truncated = [], 0
    for b in range(batch):
        ratios = [math.exp(own[b].item() - behaviour[b].item())]
        ratios += [math.exp(other[k, b].item() - behaviour[b].item()) for k in range(others)]
        smallest = abs(min(ratios))
        expected.append(min(smallest, rho))
        truncated += smallest > rho
    torch.testing.assert_close(weights.tolist(), expected)
    assert stats.fraction_truncated == pytest.approx(truncated / batch)
    assert stats.mean_weight == pytest.approx(sum(expected) / batch)


def test_computed_without_gradient_and_shape_checked() -> None:
    own = _log(0.5, 0.5).requires_grad_(True)
    weights = truncated_is_weight(own, torch.stack([_log(0.4, 0.6)]), _log(0.5, 0.5), rho=1.0)
    assert not weights.requires_grad
    with pytest.raises(ValueError, match="other_log_probs"):
        truncated_is_weight(own, _log(0.4, 0.6), _log(0.5, 0.5), rho=1.0)


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])
def test_learners_weigh_against_the_other_held_policies_log_probs(action_space: gym.spaces.Space) -> None:
    """`learn.is_weights` takes each held policy's log π(a|s) (and nothing else of it): R' as Eq. 2 gives it."""
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-5, 5, (4,))
    own, *others = (build_policy(obs_space, action_space, hidden=(8,), normalize_obs=True) for _ in range(3))
    obs = torch.randn(16, 4)
    actions = torch.stack([torch.as_tensor(action_space.sample()) for _ in range(16)])
    own_logp = own.evaluate(obs, actions)[0]
    behaviour = own_logp.detach() + 0.1 * torch.randn(16)
    weights, stats = is_weights(own_logp, others, obs, actions, behaviour, rho=1.0)
    held = torch.stack([p.evaluate(obs, actions)[0] for p in others]).detach()
    torch.testing.assert_close(weights, truncated_is_weight(own_logp.detach(), held, behaviour, rho=1.0))
    assert stats["other_policies"] == 2.0
