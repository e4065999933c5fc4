"""PPO's gradient for MLP policies on the CPU, in NumPy with the derivatives written out
(``functions.model.numpy_mlp``).

At the fast preset's sizes (64×64 tanh, minibatches of 64) a torch minibatch gradient is mostly per-op dispatch and
autograd bookkeeping. Measured on this machine's 2 cores, a round's 320 Hopper minibatch gradients: 0.23-0.27 s
here against 0.65-0.75 s in torch, and 0.26-0.30 s against 0.82-1.02 s with another learner's policy to truncate
against. This computes what ``ppo_algo.gradient`` computes: ``ppo.ppo_loss`` with every truncation form, R' against
the other learners' policies, the observation normaliser, advantage standardisation, the clipped value loss, the KL
penalty, the entropy bonus, the gradient-norm clip and the packed layout, with

    Gaussian ∂log π/∂m = (a − m)/σ², ∂log π/∂log σ = (a − m)²/σ² − 1;  categorical ∂log π/∂z = onehot(a) − p;
    entropy H = −Σ p log p:  ∂H/∂z = −p·(log p + H)

Ties of min/max share the gradient half and half, and a clamp passes it on its closed interval, as torch's
derivatives do, so the result matches autograd's to float rounding (``tests/functions/test_ppo_numpy.py``).
Set ``STELLARIS_TORCH_GRADIENT=1`` to send every gradient through torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from functions.model.numpy_mlp import F32, LOG_SQRT_2PI, Net, log_prob_of, nets
from functions.model.policies import ActorCritic

if TYPE_CHECKING:
    from contract.algo_config import PPOConfig
    from functions.algos.ppo_round import PPORound


def plan(policy: ActorCritic, others: Sequence[ActorCritic] = ()) -> list[Net] | None:
    """`policy` and each of `others` as the array math takes them, or None: then the gradient is torch's."""
    return None if torch_gradient() else nets(policy, others)


_SWITCH = "STELLARIS_TORCH_GRADIENT"
_ON, _OFF = ("1", "true", "yes"), ("", "0", "false", "no")


def torch_gradient() -> bool:
    """Whether ``STELLARIS_TORCH_GRADIENT`` sends every gradient through torch (1/true/yes; unset, 0/false/no: no)."""
    value = os.environ.get(_SWITCH, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{_SWITCH}={os.environ[_SWITCH]!r}: use 1, true or yes (torch), or 0, false or no (NumPy)")
    return value in _ON


def _min_grad(u: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(∂min/∂u, ∂min/∂c) of min(u, c) per sample: ties split in half, as torch.minimum's backward."""
    tie = u == c
    gu = np.where(tie, 0.5, (u < c).astype(F32))
    return gu.astype(F32), np.where(tie, 0.5, 1 - gu).astype(F32)


def _over(value: np.ndarray, p: np.ndarray) -> np.ndarray:
    """value/p where p > 0, else 0: a ratio that underflowed to 0 has R' = 0 (R' ≤ own ratio), so no 0/0."""
    return np.where(p > 0, value / np.where(p > 0, p, 1), 0).astype(F32)


def _surrogate(
    logp: np.ndarray,
    ratio: np.ndarray,
    adv: np.ndarray,
    weights: np.ndarray | None,
    prox: np.ndarray | None,
    cfg: PPOConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-sample surrogate s, ∂s/∂log π, the ratio the clip is taken on) for `ppo.clipped_surrogate`'s forms;
    `ratio` is π_θ/μ."""
    form, lo, hi = cfg.stellaris.truncation_form, 1.0 - cfg.clip, 1.0 + cfg.clip
    scale: np.ndarray | None  # what s and its gradient are scaled by, if anything
    if form == "decoupled":
        if prox is None:
            raise ValueError("the decoupled form needs the round's proximal log-probs")
        p = np.exp(logp - prox)
        value = ratio if weights is None else weights
        scale = _over(value, p)
    else:
        p = ratio
        scale = _over(weights, p) if form == "weighted" and weights is not None else None
    inside = ((p >= lo) & (p <= hi)).astype(F32)
    clipped = np.clip(p, lo, hi) * adv
    if form == "surrogate" and weights is not None:
        s_ratio = _over(weights, ratio)
        u = ratio * s_ratio * adv  # r·stopgrad(R'/r): valued R', ∂ of r scaled by R'/r
        gu, gc = _min_grad(u, clipped)
        ds_dlogp = gu * adv * s_ratio * ratio + gc * adv * inside * ratio
        return np.minimum(u, clipped), ds_dlogp, ratio
    gu, gc = _min_grad(p * adv, clipped)
    s = np.minimum(p * adv, clipped)
    ds_dlogp = (gu + gc * inside) * adv * p
    if scale is not None:
        s, ds_dlogp = scale * s, scale * ds_dlogp
    return s, ds_dlogp, p


def gradient(
    nets: list[Net], data: PPORound, idx: torch.Tensor, cfg: PPOConfig, kl_coef: float
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """``ppo_algo.gradient``'s result for the minibatch `idx` of the round (the caller drew it); `nets` is `plan`'s:
    the learner's policy, then the other learners'."""
    i = idx.numpy()
    net, others = nets[0], nets[1:]
    shape = net.shape
    obs, act, mu = data.obs.numpy()[i], data.actions.numpy()[i], data.behaviour_log_probs.numpy()[i]
    adv, ret = data.advantages.numpy()[i].astype(F32), data.returns.numpy()[i].astype(F32)
    n = len(i)
    if cfg.normalize_advantages and n > 1:
        adv = ((adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)).astype(F32)
    x = net.features(obs)
    actor_acts = net.forward(net.actor, x)
    critic_acts = net.forward(net.critic, x)
    logp, cache = log_prob_of(actor_acts[-1], act, net.log_std)
    values = critic_acts[-1][:, 0]
    log_ratio = logp - mu
    ratio = np.exp(log_ratio)

    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        ratios = np.stack([ratio, *(np.exp(o.log_prob(obs, act) - mu) for o in others)])
        smallest = np.abs(ratios.min(0))
        weights = np.minimum(smallest, cfg.stellaris.rho).astype(F32)
        stats = {
            "truncated_fraction": float((smallest > cfg.stellaris.rho).mean()),
            "mean_is_weight": float(weights.mean()),
            "other_policies": float(len(others)),
        }
    prox = None if data.proximal_log_probs is None else data.proximal_log_probs.numpy()[i]
    s, ds_dlogp, clipped_ratio = _surrogate(logp, ratio, adv, weights, prox, cfg)
    kl = (ratio - 1) - log_ratio  # k3 estimator of KL(μ‖π_θ), per sample
    g_logp = -ds_dlogp / n + kl_coef * (ratio - 1) / n  # policy loss = −mean(s); ∂kl/∂log π = ratio − 1

    value_loss, g_values = _value_loss(values, ret, data, i, cfg)
    g_values *= cfg.vf_coef

    if net.log_std is None:  # categorical: `cache` is log p over actions
        p = np.exp(cache)
        entropy = -(p * cache).sum(-1)
        g_out = -p * g_logp[:, None]
        g_out[np.arange(n), act.reshape(-1).astype(np.int64)] += g_logp
        g_out += (cfg.ent_coef / n) * p * (cache + entropy[:, None])
        g_log_std = None
    else:  # Gaussian: `cache` is (a − m)/σ²
        g_out = g_logp[:, None] * cache
        diff_sq = cache * (act - actor_acts[-1])
        g_log_std = (g_logp[:, None] * (diff_sq - 1)).sum(0) - cfg.ent_coef
        entropy = np.full(n, (0.5 + LOG_SQRT_2PI + net.log_std).sum(), dtype=F32)

    grads = dict(zip(_names(shape.actor), net.backward(net.actor, actor_acts, g_out.astype(F32)), strict=True))
    critic = net.backward(net.critic, critic_acts, g_values[:, None].astype(F32))
    grads.update(zip(_names(shape.critic), critic, strict=True))
    if g_log_std is not None:
        grads["log_std"] = g_log_std.astype(F32)

    policy_loss, mean_entropy = -float(s.mean()), float(entropy.mean())
    total = policy_loss + cfg.vf_coef * value_loss + kl_coef * float(kl.mean()) - cfg.ent_coef * mean_entropy
    stats |= {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "approx_kl": float(((ratio - 1.0) - np.log(ratio)).mean()),
        "clip_fraction": float((np.abs(clipped_ratio - 1.0) > cfg.clip).mean()),
        "samples": float(n),
    }
    return net.pack(grads, cfg.max_grad_norm), stats


def _names(layers: tuple[tuple[str, str], ...]) -> list[str]:
    return [name for pair in layers for name in pair]


def _value_loss(
    values: np.ndarray, ret: np.ndarray, data: PPORound, i: np.ndarray, cfg: PPOConfig
) -> tuple[float, np.ndarray]:
    """(½·mean of the squared error, its gradient per value), PPO2's clipped form with `vf_clip`."""
    n = len(values)
    err = values - ret
    squared, g = err * err, err / n  # ∂(½·mean(e²))/∂v = e/n
    if cfg.vf_clip is not None:
        old = data.values.numpy()[i].astype(F32)
        delta = values - old
        err_c = old + np.clip(delta, -cfg.vf_clip, cfg.vf_clip) - ret
        squared_c = err_c * err_c
        inside = ((delta >= -cfg.vf_clip) & (delta <= cfg.vf_clip)).astype(F32)
        ga, gb = _min_grad(-squared, -squared_c)  # max(a, b) = −min(−a, −b)
        g = ga * g + gb * inside * err_c / n
        squared = np.maximum(squared, squared_c)
    return 0.5 * float(squared.mean()), g.astype(F32)
