"""IMPACT loss against hand arithmetic; gradients; target updates; presets."""

from __future__ import annotations

import math

import pytest
import torch

from contract.algo_config import IMPACTConfig, preset
from functions.algos.impact import impact_loss, should_update_target
from functions.algos.vtrace import vtrace


def _rollout() -> dict[str, torch.Tensor]:
    # π_target/μ = [0.5, 2.0] (as in test_vtrace); π_θ/π_target = [1.1, 1.6]
    return {
        "new_log_probs": torch.log(torch.tensor([0.22, 0.64], dtype=torch.float64)),
        "target_log_probs": torch.log(torch.tensor([0.2, 0.4], dtype=torch.float64)),
        "behaviour_log_probs": torch.log(torch.tensor([0.4, 0.2], dtype=torch.float64)),
        "rewards": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "values": torch.tensor([0.0, 1.0], dtype=torch.float64),
        "bootstrap_value": torch.tensor(3.0, dtype=torch.float64),
        "discounts": torch.tensor([0.9, 0.9], dtype=torch.float64),
        "entropy": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "kl": torch.tensor([0.2, 0.4], dtype=torch.float64),
    }


def test_hand_computed_terms() -> None:
    # V-trace w.r.t. the target network (see test_vtrace): v_s = [2.615, 4.7], A = [2.615, 3.7]
    # clip ε = 0.4, r = π_θ/π_target = [1.1, 1.6]:
    #   sample 0: r·A = 2.8765, clip(r)·A = 1.1·2.615 = 2.8765      → 2.8765
    #   sample 1: r·A = 5.92,   clip(r)·A = 1.4·3.7 = 5.18          → 5.18
    #   policy loss = −(2.8765 + 5.18)/2 = −4.02825
    # value loss = ½·mean((0 − 2.615)², (1 − 4.7)²) = ½·(6.838225 + 13.69)/2 = 5.13205625
    # KL penalty = 1.0·mean(0.2, 0.4) = 0.3;  entropy = 1.5
    # total = −4.02825 + 1.0·5.13205625 + 0.3 − 0.01·1.5 = 1.38880625;  clip fraction = 1/2
    terms = impact_loss(**_rollout(), clip=0.4, kl_coef=1.0, vf_coef=1.0, ent_coef=0.01)
    torch.testing.assert_close(terms.vs, torch.tensor([2.615, 4.7], dtype=torch.float64))
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([2.615, 3.7], dtype=torch.float64))
    assert terms.policy_loss.item() == pytest.approx(-4.02825)
    assert terms.value_loss.item() == pytest.approx(5.13205625)
    assert terms.kl_penalty.item() == pytest.approx(0.3)
    assert terms.mean_kl.item() == pytest.approx(0.3)
    assert terms.entropy.item() == pytest.approx(1.5)
    assert terms.total.item() == pytest.approx(1.38880625)
    assert terms.clip_fraction.item() == pytest.approx(0.5)


def test_gradients_flow_to_policy_and_critic_only() -> None:
    rollout = _rollout()
    rollout["new_log_probs"].requires_grad_(True)
    rollout["values"].requires_grad_(True)
    rollout["target_log_probs"].requires_grad_(True)
    terms = impact_loss(**rollout, clip=0.4, kl_coef=0.0, vf_coef=1.0, ent_coef=0.0)
    grad_log_probs, grad_values, grad_target = torch.autograd.grad(
        terms.total,
        [rollout["new_log_probs"], rollout["values"], rollout["target_log_probs"]],
        allow_unused=True,
    )
    # critic: d/dV ½·mean((V − v_s)²) = (V − v_s)/T = [(0 − 2.615)/2, (1 − 4.7)/2]; v_s is a constant target
    torch.testing.assert_close(grad_values, torch.tensor([-1.3075, -1.85], dtype=torch.float64))
    # policy: sample 0 unclipped: −r·A/T = −1.1·2.615/2 = −1.43825; sample 1 clipped: 0
    torch.testing.assert_close(grad_log_probs, torch.tensor([-1.43825, 0.0], dtype=torch.float64))
    # the target network is a constant
    assert grad_target is None or torch.count_nonzero(grad_target) == 0


def test_is_weights_replace_vtrace_rho() -> None:
    rollout = _rollout()
    is_weights = torch.tensor([0.25, 0.5], dtype=torch.float64)
    terms = impact_loss(**rollout, clip=0.4, kl_coef=1.0, vf_coef=1.0, ent_coef=0.01, is_weights=is_weights)
    vs, advantages = vtrace(
        rollout["behaviour_log_probs"],
        rollout["target_log_probs"],
        rollout["rewards"],
        rollout["values"],
        rollout["bootstrap_value"],
        rollout["discounts"],
        is_weights=is_weights,
    )
    # hand numbers of test_vtrace: v_s = [1.3075, 2.85], A = [0.89125, 1.85]
    torch.testing.assert_close(terms.vs, vs)
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([0.89125, 1.85], dtype=torch.float64))
    # policy loss = −(1.1·0.89125 + 1.4·1.85)/2 = −(0.980375 + 2.59)/2
    assert terms.policy_loss.item() == pytest.approx(-(0.980375 + 2.59) / 2)
    torch.testing.assert_close(advantages, terms.pg_advantages)


def test_replay_weights_scale_each_samples_policy_and_value_terms() -> None:
    # Prioritized replay's importance weights w = [1.0, 0.5] (Schaul et al. 2016) scale each sample's loss before
    # the mean (÷ T = 2, not ÷ Σw); per-sample terms as in test_hand_computed_terms:
    #   policy loss = −(1.0·2.8765 + 0.5·5.18)/2 = −(2.8765 + 2.59)/2 = −2.73325
    #   value loss  = ½·(1.0·6.838225 + 0.5·13.69)/2 = ½·(6.838225 + 6.845)/2 = 3.42080625
    #   KL and entropy are not weighted: 0.3 and 1.5
    #   total = −2.73325 + 1.0·3.42080625 + 0.3 − 0.01·1.5 = 0.97255625
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    terms = impact_loss(**_rollout(), clip=0.4, kl_coef=1.0, vf_coef=1.0, ent_coef=0.01, sample_weights=w)
    assert terms.policy_loss.item() == pytest.approx(-2.73325)
    assert terms.value_loss.item() == pytest.approx(3.42080625)
    assert terms.kl_penalty.item() == pytest.approx(0.3) and terms.entropy.item() == pytest.approx(1.5)
    assert terms.total.item() == pytest.approx(0.97255625)
    # the targets and advantages (and so the priorities computed from them) are the unweighted ones
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([2.615, 3.7], dtype=torch.float64))


@pytest.mark.parametrize("shape", [(2,), (8, 3)])
def test_replay_weights_of_one_give_exactly_the_unweighted_loss_and_gradients(shape: tuple[int, ...]) -> None:
    """Fresh batches and the uniform, fifo and full_batch patterns weigh 1.0: bit for bit the loss without weights."""
    generator = torch.Generator().manual_seed(3)

    def draw() -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float32)

    new, target, behaviour = draw() * 0.3 - 1, draw() * 0.3 - 1, draw() * 0.3 - 1
    rewards, values, entropy, kl = draw(), draw(), draw().abs(), draw().abs()
    bootstrap = torch.randn(shape[1:], generator=generator)
    discounts = torch.full(shape, 0.99)
    out = []
    for weights in (None, torch.ones(shape)):
        leaf_new, leaf_values = new.clone().requires_grad_(True), values.clone().requires_grad_(True)
        terms = impact_loss(
            leaf_new,
            target,
            behaviour,
            rewards,
            leaf_values,
            bootstrap,
            discounts,
            entropy,
            kl,
            clip=0.4,
            kl_coef=0.5,
            vf_coef=0.8,
            ent_coef=0.02,
            sample_weights=weights,
        )
        out.append((terms, torch.autograd.grad(terms.total, [leaf_new, leaf_values])))
    (plain, plain_grads), (ones, ones_grads) = out
    for name in ("policy_loss", "value_loss", "kl_penalty", "entropy", "total"):
        assert torch.equal(getattr(plain, name), getattr(ones, name)), name
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, ones_grads, strict=True))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", [(5,), (8, 3)])
def test_matches_reference_composition(seed: int, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(seed)

    def draw() -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64)

    new, target, behaviour = draw() * 0.3 - 1, draw() * 0.3 - 1, draw() * 0.3 - 1
    rewards, values, entropy, kl = draw(), draw(), draw().abs(), draw().abs()
    bootstrap = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
    discounts = torch.full(shape, 0.99, dtype=torch.float64)
    clip = 0.4
    terms = impact_loss(
        new,
        target,
        behaviour,
        rewards,
        values,
        bootstrap,
        discounts,
        entropy,
        kl,
        clip=clip,
        kl_coef=0.5,
        vf_coef=0.8,
        ent_coef=0.02,
    )
    vs, advantages = vtrace(behaviour, target, rewards, values, bootstrap, discounts)
    flat_new, flat_target, flat_adv = new.flatten(), target.flatten(), advantages.flatten()
    surrogate = 0.0
    for i in range(flat_new.numel()):
        r = math.exp(flat_new[i].item() - flat_target[i].item())
        a = flat_adv[i].item()
        surrogate += min(r * a, min(max(r, 1 - clip), 1 + clip) * a)
    policy = -surrogate / flat_new.numel()
    value = 0.5 * ((values - vs) ** 2).mean().item()
    assert terms.policy_loss.item() == pytest.approx(policy)
    assert terms.total.item() == pytest.approx(
        policy + 0.8 * value + 0.5 * kl.mean().item() - 0.02 * entropy.mean().item()
    )


def test_should_update_target() -> None:
    # frequency in rounds: 1.0 → after every round, 2.0 → every second round, 0.5 → still every round
    assert not should_update_target(0, target_update_frequency=1.0)
    assert should_update_target(1, target_update_frequency=1.0)
    assert not should_update_target(1, target_update_frequency=2.0)
    assert should_update_target(2, target_update_frequency=2.0)
    assert should_update_target(1, target_update_frequency=0.5)
    with pytest.raises(ValueError):
        should_update_target(1, target_update_frequency=0.0)


def test_paper_and_fast_presets() -> None:
    paper = preset("paper", "impact", "mujoco")
    assert isinstance(paper, IMPACTConfig)
    # Table III
    assert (paper.lr, paper.gamma, paper.train_batch_size, paper.clip) == (5e-4, 0.99, 4096, 0.4)
    assert (paper.kl_coef, paper.kl_target, paper.ent_coef, paper.vf_coef) == (1.0, 0.01, 0.01, 1.0)
    assert paper.target_update_frequency == 1.0
    assert (paper.rho_bar, paper.c_bar) == (1.0, 1.0)
    assert preset("paper", "impact", "atari").train_batch_size == 256
    fast = preset("fast", "impact", "mujoco")
    minibatch_size = fast.train_batch_size // fast.num_minibatches
    assert (fast.lr, fast.train_batch_size, minibatch_size, fast.num_epochs, fast.kl_coef) == (
        3e-4,
        2048,
        64,
        10,
        0.0,
    )
    with pytest.raises(ValueError):
        preset("slow", "impact", "mujoco")  # type: ignore[arg-type]
