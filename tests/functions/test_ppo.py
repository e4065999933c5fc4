"""PPO loss against hand arithmetic and a per-sample reference; the truncated ratio's gradient; presets."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from contract.algo_config import PPOConfig, preset
from functions.algos.ppo import adaptive_kl_coef, clipped_surrogate, ppo_loss, truncated_ratio, value_loss


def _batch() -> dict[str, torch.Tensor]:
    # r = π_θ/μ = [1.5, 0.5]
    return {
        "new_log_probs": torch.log(torch.tensor([0.6, 0.2], dtype=torch.float64)),
        "behaviour_log_probs": torch.log(torch.tensor([0.4, 0.4], dtype=torch.float64)),
        "advantages": torch.tensor([2.0, -1.0], dtype=torch.float64),
        "values": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "returns": torch.tensor([2.0, 0.0], dtype=torch.float64),
        "entropy": torch.tensor([1.0, 0.5], dtype=torch.float64),
        "kl": torch.tensor([0.1, 0.3], dtype=torch.float64),
    }


def test_hand_computed_terms() -> None:
    # clip ε = 0.2:
    #   sample 0: r = 1.5, A = 2:  r·A = 3.0, clip(r)·A = 1.2·2 = 2.4  → 2.4
    #   sample 1: r = 0.5, A = −1: r·A = −0.5, clip(r)·A = 0.8·−1 = −0.8 → −0.8
    #   policy loss = −(2.4 − 0.8)/2 = −0.8
    # value loss = ½·mean((1 − 2)², (2 − 0)²) = ½·2.5 = 1.25
    # KL penalty = 0.5·mean(0.1, 0.3) = 0.1;  entropy = mean(1.0, 0.5) = 0.75
    # total = −0.8 + 1.0·1.25 + 0.1 − 0.01·0.75 = 0.5425
    # clip fraction = 1 (|0.5| > 0.2 for both); approx KL = mean(r − 1 − ln r)
    #   = ((0.5 − ln 1.5) + (−0.5 − ln 0.5))/2 = (0.0945349 + 0.1931472)/2 = 0.1438410
    terms = ppo_loss(**_batch(), clip=0.2, kl_coef=0.5, vf_coef=1.0, ent_coef=0.01)
    assert terms.policy_loss.item() == pytest.approx(-0.8)
    assert terms.value_loss.item() == pytest.approx(1.25)
    assert terms.kl_penalty.item() == pytest.approx(0.1)
    assert terms.entropy.item() == pytest.approx(0.75)
    assert terms.total.item() == pytest.approx(0.5425)
    assert terms.clip_fraction.item() == pytest.approx(1.0)
    assert terms.approx_kl.item() == pytest.approx(((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2)


def test_truncated_unclipped_term() -> None:
    # R' = [0.6, 0.4]:
    #   sample 0: r̃·A = 0.6·2 = 1.2 < clip(r)·A = 2.4   → 1.2
    #   sample 1: r̃·A = 0.4·−1 = −0.4 > clip(r)·A = −0.8 → −0.8 (the clipped term stays clip(r)·A)
    #   policy loss = −(1.2 − 0.8)/2 = −0.2
    is_weights = torch.tensor([0.6, 0.4], dtype=torch.float64)
    terms = ppo_loss(**_batch(), clip=0.2, kl_coef=0.0, vf_coef=1.0, ent_coef=0.0, is_weights=is_weights)
    assert terms.policy_loss.item() == pytest.approx(-0.2)


def test_truncated_ratio_value_is_weight_and_gradient_scaled_by_weight_over_ratio() -> None:
    behaviour = torch.log(torch.tensor([0.5, 0.4, 0.25], dtype=torch.float64))
    is_weights = torch.tensor([0.45, 1.0, 0.3], dtype=torch.float64)
    # r = [0.9, 1.25, 1.2]; d r/d log π = r; d r̃/d log π = r·R'/r = R'
    log_probs = torch.log(torch.tensor([0.45, 0.5, 0.3], dtype=torch.float64)).requires_grad_(True)
    ratio = torch.exp(log_probs - behaviour)
    (grad_plain,) = torch.autograd.grad(ratio.sum(), log_probs)
    (grad_truncated,) = torch.autograd.grad(
        truncated_ratio(torch.exp(log_probs - behaviour), is_weights).sum(), log_probs
    )
    torch.testing.assert_close(truncated_ratio(ratio, is_weights).detach(), is_weights)
    torch.testing.assert_close(grad_plain, torch.tensor([0.9, 1.25, 1.2], dtype=torch.float64))
    torch.testing.assert_close(grad_truncated, grad_plain * is_weights / ratio.detach())


def test_truncated_ratio_survives_underflow() -> None:
    # float32 exp(−120) underflows to 0; R' is then 0 too and r̃ must be 0, not 0/0
    ratio = torch.exp(torch.tensor([-120.0, 0.0]))
    result = truncated_ratio(ratio, torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(result, torch.tensor([0.0, 1.0]))


def test_policy_loss_gradient_through_truncated_ratio() -> None:
    # one sample inside the clip range: r = 0.9, A = 1, R' = 0.45 → min(0.45, 0.9) picks r̃·A.
    # d(−r̃·A)/d log π = −R'·A = −0.45, vs −r·A = −0.9 without truncation: ratio R'/r = 0.5
    behaviour = torch.log(torch.tensor([0.5], dtype=torch.float64))
    advantages = torch.tensor([1.0], dtype=torch.float64)
    zeros = torch.zeros(1, dtype=torch.float64)
    grads = []
    for is_weights in (None, torch.tensor([0.45], dtype=torch.float64)):
        log_probs = torch.log(torch.tensor([0.45], dtype=torch.float64)).requires_grad_(True)
        terms = ppo_loss(
            log_probs,
            behaviour,
            advantages,
            zeros,
            zeros,
            zeros,
            None,
            clip=0.2,
            kl_coef=0.0,
            vf_coef=0.0,
            ent_coef=0.0,
            is_weights=is_weights,
        )
        (grad,) = torch.autograd.grad(terms.total, log_probs)
        grads.append(grad.item())
    assert grads[0] == pytest.approx(-0.9)
    assert grads[1] == pytest.approx(-0.45)


def test_sample_weights_scale_each_samples_surrogate_and_value_term() -> None:
    # APPO with prioritized replay: w = [1.0, 0.5] on test_hand_computed_terms' batch, scaled before the mean:
    #   policy loss = −(1.0·2.4 + 0.5·(−0.8))/2 = −(2.4 − 0.4)/2 = −1.0
    #   value loss  = ½·(1.0·1 + 0.5·4)/2 = ½·1.5 = 0.75
    #   KL 0.1 and entropy 0.75 are not weighted: total = −1.0 + 0.75 + 0.1 − 0.0075 = −0.1575
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    terms = ppo_loss(**_batch(), clip=0.2, kl_coef=0.5, vf_coef=1.0, ent_coef=0.01, sample_weights=w)
    assert terms.policy_loss.item() == pytest.approx(-1.0)
    assert terms.value_loss.item() == pytest.approx(0.75)
    assert terms.total.item() == pytest.approx(-0.1575)
    ones = ppo_loss(**_batch(), clip=0.2, kl_coef=0.5, vf_coef=1.0, ent_coef=0.01, sample_weights=torch.ones(2))
    plain = ppo_loss(**_batch(), clip=0.2, kl_coef=0.5, vf_coef=1.0, ent_coef=0.01)
    assert torch.equal(ones.total, plain.total)
    # the clipped value form weighs the max of the two: V = 2, V_old = 1, ε_v = 0.2, R = 2 → ½·0.5·0.64 = 0.16
    values, old, returns = (torch.tensor([x], dtype=torch.float64) for x in (2.0, 1.0, 2.0))
    half = torch.tensor([0.5], dtype=torch.float64)
    assert value_loss(values, returns, old_values=old, vf_clip=0.2, sample_weights=half).item() == pytest.approx(0.16)


def test_clipped_value_loss() -> None:
    # V = 2.0, V_old = 1.0, ε_v = 0.2, R = 2.0: unclipped (2 − 2)² = 0; clipped V = 1.2 → (1.2 − 2)² = 0.64
    # ½·max(0, 0.64) = 0.32
    values, old, returns = (torch.tensor([x], dtype=torch.float64) for x in (2.0, 1.0, 2.0))
    assert value_loss(values, returns, old_values=old, vf_clip=0.2).item() == pytest.approx(0.32)
    assert value_loss(values, returns).item() == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("truncate", [False, True])
def test_matches_per_sample_reference(seed: int, batch: int, truncate: bool) -> None:
    generator = torch.Generator().manual_seed(seed)

    def draw(scale: float = 1.0) -> torch.Tensor:
        return torch.randn(batch, generator=generator, dtype=torch.float64) * scale

    new, old, adv, values, returns, entropy = draw(0.3), draw(0.3), draw(), draw(), draw(), draw().abs()
    kl = draw().abs()
    is_weights = torch.rand(batch, generator=generator, dtype=torch.float64) if truncate else None
    clip, kl_coef, vf_coef, ent_coef = 0.25, 0.3, 0.7, 0.05
    terms = ppo_loss(
        new,
        old,
        adv,
        values,
        returns,
        entropy,
        kl,
        clip=clip,
        kl_coef=kl_coef,
        vf_coef=vf_coef,
        ent_coef=ent_coef,
        is_weights=is_weights,
    )

    surrogate = 0.0
    for b in range(batch):
        r = math.exp(new[b].item() - old[b].item())
        weighted = is_weights[b].item() if is_weights is not None else r
        clipped = min(max(r, 1 - clip), 1 + clip)
        surrogate += min(weighted * adv[b].item(), clipped * adv[b].item())
    policy = -surrogate / batch
    value = 0.5 * sum((values[b].item() - returns[b].item()) ** 2 for b in range(batch)) / batch
    total = policy + vf_coef * value + kl_coef * kl.mean().item() - ent_coef * entropy.mean().item()
    assert terms.policy_loss.item() == pytest.approx(policy)
    assert terms.value_loss.item() == pytest.approx(value)
    assert terms.total.item() == pytest.approx(total)


def test_clipped_surrogate_without_weights_is_vanilla_ppo() -> None:
    ratio = torch.tensor([0.7, 1.0, 1.3])
    advantages = torch.tensor([1.0, -1.0, 1.0])
    # [min(0.7, 0.8), min(−1, −1), min(1.3, 1.2)] = [0.7, −1.0, 1.2]
    torch.testing.assert_close(clipped_surrogate(ratio, advantages, clip=0.2), torch.tensor([0.7, -1.0, 1.2]))


def test_kl_required_when_penalised() -> None:
    batch = _batch()
    batch["kl"] = None  # type: ignore[assignment]
    with pytest.raises(ValueError, match="kl is required"):
        ppo_loss(**batch, clip=0.2, kl_coef=0.2, vf_coef=1.0, ent_coef=0.0)
    terms = ppo_loss(**batch, clip=0.2, kl_coef=0.0, vf_coef=1.0, ent_coef=0.0)
    assert terms.kl_penalty.item() == 0.0


def test_adaptive_kl_coefficient() -> None:
    # target 0.01: above 0.02 → ×1.5, below 0.005 → ×0.5, the bounds themselves leave it alone
    assert adaptive_kl_coef(0.2, 0.03, target=0.01) == pytest.approx(0.3)
    assert adaptive_kl_coef(0.2, 0.004, target=0.01) == pytest.approx(0.1)
    assert adaptive_kl_coef(0.2, 0.01, target=0.01) == 0.2
    assert adaptive_kl_coef(0.2, 0.02, target=0.01) == 0.2
    assert adaptive_kl_coef(0.2, 0.005, target=0.01) == 0.2


def test_paper_and_fast_presets() -> None:
    paper = preset("paper", "ppo", "mujoco")
    assert isinstance(paper, PPOConfig)
    # Table III
    assert (paper.lr, paper.gamma, paper.train_batch_size, paper.clip) == (5e-5, 0.99, 4096, 0.3)
    assert (paper.kl_coef, paper.kl_target, paper.ent_coef, paper.vf_coef) == (0.2, 0.01, 0.0, 1.0)
    assert paper.network.hidden == (256, 256) and paper.network.activation == "tanh"
    assert (paper.stellaris.d, paper.stellaris.v, paper.stellaris.rho) == (0.96, 3.0, 1.0)
    assert preset("paper", "ppo", "atari").train_batch_size == 256
    assert preset("paper", "ppo", "atari").network.kind == "atari"

    fast = preset("fast", "ppo", "mujoco")
    assert isinstance(fast, PPOConfig)
    minibatch_size = fast.train_batch_size // fast.num_minibatches
    assert (fast.lr, fast.train_batch_size, minibatch_size, fast.num_epochs) == (3e-4, 2048, 64, 10)
    assert (fast.clip, fast.lam, fast.kl_coef) == (0.2, 0.95, 0.0)
    assert fast.network.hidden == (64, 64) and fast.network.activation == "tanh"
    assert fast.normalize_obs and fast.normalize_reward
    assert fast.num_epochs * fast.num_minibatches == 320  # learner tasks (gradients) per round
    # Adam's ε: CleanRL's (and the plain single-file baseline's) in the fast presets, torch's default in the paper's
    assert fast.adam_eps == preset("fast", "ppo", "atari").adam_eps == 1e-5 and paper.adam_eps == 1e-8
    # PPO on MuJoCo-like envs clips against the round's first policy; the paper preset keeps docs/algorithms.md form,
    # and
    # the V-trace algorithms (a target network of their own) and Atari (not measured) keep theirs.
    assert fast.stellaris.truncation_form == "decoupled" and paper.stellaris.truncation_form == "surrogate"
    assert preset("fast", "ppo", "atari").stellaris.truncation_form == "surrogate"
    assert preset("fast", "appo", "mujoco").stellaris.truncation_form == "surrogate"


def test_config_is_frozen_and_validated() -> None:
    config = PPOConfig()
    with pytest.raises(ValidationError):
        config.clip = 0.5  # type: ignore[misc]
    with pytest.raises(ValidationError):
        PPOConfig(clip=0.0)
    with pytest.raises(ValidationError):
        PPOConfig(stellaris={"d": 1.5})
    with pytest.raises(ValidationError, match="divisible"):
        PPOConfig(train_batch_size=100, num_minibatches=3)
    with pytest.raises(ValidationError):
        PPOConfig(unknown_field=1)
    assert PPOConfig.model_validate_json(config.model_dump_json()) == config


def _surrogate_grads(log_pi: list[float], log_mu: list[float], adv: list[float], weights: list[float], form: str):
    log_probs = torch.tensor(log_pi, dtype=torch.float64, requires_grad=True)
    ratio = torch.exp(log_probs - torch.tensor(log_mu, dtype=torch.float64))
    w = torch.tensor(weights, dtype=torch.float64)
    objective = clipped_surrogate(ratio, torch.tensor(adv, dtype=torch.float64), clip=0.2, is_weights=w, form=form)
    (grad,) = torch.autograd.grad(objective.sum(), log_probs)
    return objective.detach().tolist(), grad.tolist()


def test_weighted_truncation_keeps_the_trust_region_the_surrogate_form_loses() -> None:
    # Sample 1: r = 1.5 (> 1 + ε), A = 1, R' = 1. Surrogate form: min(R'·A, 1.2·A) = 1 picks the unclipped term,
    #   gradient d/dlog π = R'·A = 1 (the clip no longer stops it). Weighted: (R'/r)·min(1.5, 1.2) = 0.8, clipped:
    #   gradient 0, as in vanilla PPO.
    # Sample 2: r = 0.9 (inside), A = 2, R' = 0.45: both forms value R'·A = 0.9 with gradient R'·A = 0.9.
    # Sample 3: r = 1.5, A = −1, R' = 1. Surrogate: min(−1, −1.2) = −1.2, clipped, gradient 0. Weighted:
    #   (1/1.5)·min(−1.5, −1.2) = −1, gradient (R'/r)·r·A = −1, vanilla PPO's pull-back scaled by R'/r.
    log_mu = [math.log(0.4), math.log(0.5), math.log(0.4)]
    log_pi = [math.log(0.6), math.log(0.45), math.log(0.6)]
    adv, weights = [1.0, 2.0, -1.0], [1.0, 0.45, 1.0]
    values, grads = _surrogate_grads(log_pi, log_mu, adv, weights, "surrogate")
    assert values == pytest.approx([1.0, 0.9, -1.2]) and grads == pytest.approx([1.0, 0.9, 0.0])
    values, grads = _surrogate_grads(log_pi, log_mu, adv, weights, "weighted")
    assert values == pytest.approx([0.8, 0.9, -1.0]) and grads == pytest.approx([0.0, 0.9, -1.0])
    # Without weights both forms are vanilla PPO.
    ratio = torch.tensor([1.5, 0.9])
    a = torch.tensor([1.0, 2.0])
    assert torch.equal(clipped_surrogate(ratio, a, clip=0.2, form="weighted"), clipped_surrogate(ratio, a, clip=0.2))


def _decoupled(log_pi: list[float], log_prox: list[float], log_mu: list[float], adv: list[float], weights):
    log_probs = torch.tensor(log_pi, dtype=torch.float64, requires_grad=True)
    ratio = torch.exp(log_probs - torch.tensor(log_mu, dtype=torch.float64))
    proximal = torch.exp(log_probs - torch.tensor(log_prox, dtype=torch.float64))
    w = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)
    objective = clipped_surrogate(ratio, a, clip=0.2, is_weights=w, form="decoupled", proximal=proximal)
    (grad,) = torch.autograd.grad(objective.sum(), log_probs)
    return objective.detach().tolist(), grad.tolist()


def test_decoupled_form_clips_against_the_proximal_policy_not_the_behaviour_policy() -> None:
    # Sample 1: μ = 0.2 (a stale behaviour policy), π_prox = 0.4, π_θ = 0.44: r = 2.2, p = π_θ/π_prox = 1.1; A = 1,
    #   R' = 1. Weighted form: clipped against μ, gradient 0. Decoupled: (R'/p)·min(1.1, 1.2) = 1, gradient R'·A = 1.
    # Sample 2: π_prox = 0.4, π_θ = μ = 0.52: p = 1.3 > 1 + ε, A = 2, R' = 0.5: (0.5/1.3)·min(2.6, 2.4) = 0.923077,
    #   clipped: gradient 0.
    # Sample 3: π_prox = 0.4, π_θ = μ = 0.3: p = 0.75, A = −1, R' = 1: (1/0.75)·min(−0.75, −0.8) = −1.066667, clipped.
    log_pi = [math.log(0.44), math.log(0.52), math.log(0.3)]
    log_prox = [math.log(0.4), math.log(0.4), math.log(0.4)]
    log_mu = [math.log(0.2), math.log(0.52), math.log(0.3)]
    adv, weights = [1.0, 2.0, -1.0], [1.0, 0.5, 1.0]
    values, grads = _decoupled(log_pi, log_prox, log_mu, adv, weights)
    assert values == pytest.approx([1.0, 0.923077, -1.066667], abs=1e-6) and grads == pytest.approx([1.0, 0.0, 0.0])
    _, weighted_grads = _surrogate_grads(log_pi, log_mu, adv, weights, "weighted")
    assert weighted_grads[0] == pytest.approx(0.0)  # the stale sample the decoupled clip keeps
    # Without R' the weight is π_prox/μ = r/p (Hilton et al.'s decoupled objective): sample 1 gives 2·min(1.1, 1.2).
    values, grads = _decoupled(log_pi[:1], log_prox[:1], log_mu[:1], adv[:1], None)
    assert values == pytest.approx([2.2]) and grads == pytest.approx([2.2])


def test_decoupled_form_with_the_behaviour_policy_as_proximal_is_the_weighted_form() -> None:
    gen = torch.Generator().manual_seed(3)
    log_pi = torch.randn(64, generator=gen, dtype=torch.float64) * 0.3 - 1.0
    log_mu = torch.randn(64, generator=gen, dtype=torch.float64) * 0.3 - 1.0
    adv = torch.randn(64, generator=gen, dtype=torch.float64)
    weights = torch.rand(64, generator=gen, dtype=torch.float64)
    ratio = torch.exp(log_pi - log_mu)
    weighted = clipped_surrogate(ratio, adv, clip=0.2, is_weights=weights, form="weighted")
    decoupled = clipped_surrogate(ratio, adv, clip=0.2, is_weights=weights, form="decoupled", proximal=ratio)
    assert torch.allclose(decoupled, weighted)


def test_decoupled_form_needs_the_proximal_ratio_and_measures_its_clip_fraction() -> None:
    with pytest.raises(ValueError, match="proximal"):
        clipped_surrogate(torch.ones(2), torch.ones(2), clip=0.2, form="decoupled")
    b = _batch()  # r = [1.5, 0.5]; with π_prox = π_θ·[1/1.1, 1]: p = [1.1, 1.0], nothing clipped against it
    prox = b["new_log_probs"] - torch.log(torch.tensor([1.1, 1.0], dtype=torch.float64))
    terms = ppo_loss(
        **b, clip=0.2, kl_coef=0.5, vf_coef=1.0, ent_coef=0.01, truncation_form="decoupled", proximal_log_probs=prox
    )
    assert terms.clip_fraction.item() == 0.0
    # without R' the weights are π_prox/μ = [1.5/1.1, 0.5]: −mean(1.5/1.1·1.1·2, 0.5·1.0·(−1)) = −(3.0 − 0.5)/2
    assert terms.policy_loss.item() == pytest.approx(-1.25)


def test_decoupled_form_is_ppos_alone() -> None:
    assert PPOConfig(stellaris={"truncation_form": "decoupled"}).stellaris.truncation_form == "decoupled"
    for algo in ("appo", "impact"):
        base = preset("fast", algo, "mujoco").model_dump()
        base["stellaris"]["truncation_form"] = "decoupled"
        with pytest.raises(ValidationError, match=f"'decoupled' is PPO's.*{algo} takes"):
            type(preset("fast", algo, "mujoco")).model_validate(base)
