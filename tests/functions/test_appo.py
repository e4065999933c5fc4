"""APPO's loss against hand-computed numbers: V-trace w.r.t. the learner policy, PPO's clip on π_θ/μ, the Stellaris
weight in both places, and its config and preset."""

from __future__ import annotations

import math

import pytest
import torch

from contract.algo_config import APPOConfig, preset
from contract.jobspec import JobRequest, JobSpec, resolve, resolve_algo
from functions.algos.appo import appo_loss
from functions.algos.vtrace import vtrace


def _inputs() -> dict[str, torch.Tensor]:
    # T = 2 steps of one env. μ = [0.5, 0.25], π_θ = [0.6, 0.25] → r = π_θ/μ = [1.2, 1.0]
    return {
        "new_log_probs": torch.log(torch.tensor([0.6, 0.25], dtype=torch.float64)).requires_grad_(True),
        "behaviour_log_probs": torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64)),
        "rewards": torch.tensor([1.0, 0.0], dtype=torch.float64),
        "values": torch.tensor([0.5, 0.2], dtype=torch.float64).requires_grad_(True),
        "bootstrap_value": torch.tensor(1.0, dtype=torch.float64),
        "discounts": torch.tensor([0.9, 0.9], dtype=torch.float64),
        "entropy": torch.tensor([1.0, 0.5], dtype=torch.float64),
    }


def test_hand_computed_loss() -> None:
    x = _inputs()
    terms = appo_loss(**x, kl=None, clip=0.1, kl_coef=0.0, vf_coef=0.5, ent_coef=0.01)
    # V-trace with π = stopgrad(π_θ): ρ = c = min(1, r) = [1, 1]
    # δ_0 = 1 + 0.9·0.2 − 0.5 = 0.68, δ_1 = 0 + 0.9·1.0 − 0.2 = 0.7
    # v_1 = 0.2 + 0.7 = 0.9, v_0 = 0.5 + 0.68 + 0.9·0.7 = 1.81
    # A_0 = 1 + 0.9·0.9 − 0.5 = 1.31, A_1 = 0 + 0.9·1.0 − 0.2 = 0.7
    torch.testing.assert_close(terms.vs, torch.tensor([1.81, 0.9], dtype=torch.float64))
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([1.31, 0.7], dtype=torch.float64))
    # surrogate (ε = 0.1): min(1.2·1.31, 1.1·1.31) = 1.441 and min(1·0.7, 1·0.7) = 0.7 → −mean = −1.0705
    assert terms.policy_loss.item() == pytest.approx(-1.0705)
    # ½·mean((0.5 − 1.81)², (0.2 − 0.9)²) = ½·(1.7161 + 0.49)/2
    assert terms.value_loss.item() == pytest.approx(0.551525)
    assert terms.entropy.item() == pytest.approx(0.75)
    assert terms.kl_penalty.item() == 0.0
    assert terms.total.item() == pytest.approx(-1.0705 + 0.5 * 0.551525 - 0.01 * 0.75)
    assert terms.clip_fraction.item() == pytest.approx(0.5)  # |1.2 − 1| > 0.1, |1 − 1| is not
    assert terms.approx_kl.item() == pytest.approx((0.2 - math.log(1.2)) / 2)

    terms.total.backward()
    # sample 0 is clipped (r = 1.2 > 1 + ε with A > 0): no policy gradient; sample 1: −A_1·r/2 = −0.35
    torch.testing.assert_close(x["new_log_probs"].grad, torch.tensor([0.0, -0.35], dtype=torch.float64))
    # value gradient: c_v·(V − v_s)/T = 0.5·[−1.31, −0.7]/2
    torch.testing.assert_close(x["values"].grad, torch.tensor([-0.3275, -0.175], dtype=torch.float64))


def test_stellaris_weight_replaces_vtrace_rho_and_values_the_ratio() -> None:
    x = _inputs()
    weights = torch.tensor([0.5, 1.0], dtype=torch.float64)
    terms = appo_loss(**x, kl=None, clip=0.1, kl_coef=0.0, vf_coef=0.5, ent_coef=0.0, is_weights=weights)
    # ρ = R' = [0.5, 1]: δ_0 = 0.5·0.68 = 0.34, v_1 = 0.9, v_0 = 0.5 + 0.34 + 0.9·0.7 = 1.47
    # A_0 = 0.5·(1 + 0.81 − 0.5) = 0.655, A_1 = 0.7
    torch.testing.assert_close(terms.vs, torch.tensor([1.47, 0.9], dtype=torch.float64))
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([0.655, 0.7], dtype=torch.float64))
    # surrogate: min(R'·A, clip(r)·A) = min(0.5·0.655, 1.1·0.655) = 0.3275 and 0.7 → −mean = −0.51375
    assert terms.policy_loss.item() == pytest.approx(-0.51375)


def test_target_kl_and_advantage_standardisation() -> None:
    x = _inputs()
    kl = torch.tensor([0.2, 0.4], dtype=torch.float64)
    terms = appo_loss(**x, kl=kl, clip=0.1, kl_coef=0.5, vf_coef=0.0, ent_coef=0.0, normalize_advantages=True)
    assert terms.kl_penalty.item() == pytest.approx(0.5 * 0.3)
    # standardised A = ±1/√2 (std of two values with Bessel's correction): min(1.2·a, 1.1·a) and min(a', a')
    a = 1 / math.sqrt(2)
    assert terms.policy_loss.item() == pytest.approx(-(1.1 * a - a) / 2, rel=1e-6)
    torch.testing.assert_close(terms.pg_advantages, torch.tensor([1.31, 0.7], dtype=torch.float64))  # reported raw
    with pytest.raises(ValueError, match="kl is required"):
        appo_loss(**_inputs(), kl=None, clip=0.1, kl_coef=1.0, vf_coef=0.5, ent_coef=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_vtrace_against_the_learner_policy(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t_len, n = 7, 3
    mu, pi = -torch.rand(t_len, n, generator=g) * 2, -torch.rand(t_len, n, generator=g) * 2
    rewards, values = torch.randn(t_len, n, generator=g), torch.randn(t_len, n, generator=g)
    boot, disc = torch.randn(n, generator=g), 0.99 * (torch.rand(t_len, n, generator=g) > 0.1).float()
    terms = appo_loss(
        pi,
        mu,
        rewards,
        values,
        boot,
        disc,
        torch.zeros(t_len, n),
        None,
        clip=0.2,
        kl_coef=0.0,
        vf_coef=1.0,
        ent_coef=0.0,
        rho_bar=1.0,
        c_bar=0.9,
    )
    vs, adv = vtrace(mu, pi, rewards, values, boot, disc, rho_bar=1.0, c_bar=0.9)
    torch.testing.assert_close(terms.vs, vs)
    torch.testing.assert_close(terms.pg_advantages, adv)
    ratio = torch.exp(pi - mu)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
    assert terms.policy_loss.item() == pytest.approx(-surrogate.mean().item(), rel=1e-5)


def test_config_preset_and_job_spec_accept_appo() -> None:
    cfg = preset("paper", "appo", "mujoco")
    assert isinstance(cfg, APPOConfig) and cfg == APPOConfig()
    assert (cfg.rho_bar, cfg.c_bar, cfg.clip, cfg.kl_coef, cfg.target_update_frequency) == (1.0, 1.0, 0.2, 0.0, 1.0)
    assert preset("fast", "appo", "atari").network.kind == "atari"
    algo = resolve_algo("appo", "paper", "CartPole-v1", {"kl_coef": 0.5})
    spec = resolve(JobRequest(job="j", env_id="CartPole-v1", algo=algo))
    assert isinstance(spec.algo, APPOConfig) and spec.algo.kl_coef == 0.5
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec  # the stored spec round-trips as APPO
