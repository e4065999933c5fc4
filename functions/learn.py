"""One learner task's gradient: batch arrays and policies in, named gradient tensors and statistics out. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from cache.records import LearnerTask as Task
from functions.algos.config import IMPACTConfig, PPOConfig
from functions.algos.gae import gae
from functions.algos.impact import IMPACTLossTerms, impact_loss
from functions.algos.ppo import PPOLossTerms, ppo_loss
from functions.algos.truncation import truncated_is_weight, truncation_stats
from functions.policies import ActorCritic, batch_moments


def _t(a: np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(a))


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, *x.shape[2:])


def _minibatch_index(total: int, task: Task) -> Tensor:
    """The task's slice of a permutation fixed by (round, epoch), so the minibatches of an epoch partition it."""
    g = torch.Generator().manual_seed(1_000_003 * task.round + task.epoch)
    perm = torch.randperm(total, generator=g)
    size = total // task.num_minibatches
    return perm[task.minibatch * size : (task.minibatch + 1) * size]


def _is_weights(
    own_logp: Tensor, others: Sequence[ActorCritic], obs: Tensor, actions: Tensor, behaviour_logp: Tensor, rho: float
) -> tuple[Tensor, dict[str, float]]:
    with torch.no_grad():
        other = [p.evaluate(obs, actions)[0] for p in others]
        other_logp = torch.stack(other) if other else own_logp.new_zeros((0, *own_logp.shape))
        weights = truncated_is_weight(own_logp.detach(), other_logp, behaviour_logp, rho=rho)
        stats = truncation_stats(own_logp.detach(), other_logp, behaviour_logp, rho=rho)
    return weights, {
        "truncated_fraction": stats.fraction_truncated,
        "mean_is_weight": stats.mean_weight,
        "other_policies": float(len(others)),
    }


def _gradients(policy: ActorCritic, loss: Tensor, max_grad_norm: float | None) -> dict[str, Tensor]:
    """d loss / d parameters as fresh tensors (autograd.grad: no .grad buffers to zero or copy), clipped to a total
    norm of `max_grad_norm` as `clip_grad_norm_` does."""
    named = list(policy.named_parameters())
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    out = [g if g is not None else torch.zeros_like(p) for (_, p), g in zip(named, grads, strict=True)]
    if max_grad_norm is not None:
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(out)))
        torch._foreach_mul_(out, torch.clamp(max_grad_norm / (total + 1e-6), max=1.0))
    return {name: g for (name, _), g in zip(named, out, strict=True)}


@dataclass(frozen=True)
class PPORound:
    """A round's samples flattened over time and envs, with GAE advantages and returns (from the actors' values,
    so the same for every task of the round: computed once per learner instance and round)."""

    obs: Tensor
    actions: Tensor
    behaviour_log_probs: Tensor
    advantages: Tensor
    returns: Tensor
    values: Tensor


def prepare_ppo_round(batches: Sequence[Mapping[str, np.ndarray]], *, gamma: float, lam: float) -> PPORound:
    parts: dict[str, list[Tensor]] = {k: [] for k in ("obs", "act", "mu", "adv", "ret", "val")}
    for b in batches:
        a, r = gae(
            _t(b["rewards"]),
            _t(b["values"]),
            _t(b["last_values"]),
            _t(b["terminations"]),
            _t(b["truncations"]),
            gamma=gamma,
            lam=lam,
            truncation_values=_t(b["truncation_values"]),
        )
        parts["obs"].append(_flat(_t(b["observations"])))
        parts["act"].append(_flat(_t(b["actions"])))
        parts["mu"].append(_flat(_t(b["behaviour_log_probs"])))
        parts["adv"].append(_flat(a))
        parts["ret"].append(_flat(r))
        parts["val"].append(_flat(_t(b["values"])))
    c = {k: torch.cat(v) for k, v in parts.items()}
    return PPORound(c["obs"], c["act"], c["mu"], c["adv"], c["ret"], c["val"])


def _loss_stats(terms: PPOLossTerms | IMPACTLossTerms, *, kl: Tensor, samples: int) -> dict[str, float]:
    return {
        "loss": float(terms.total.detach()),
        "policy_loss": float(terms.policy_loss.detach()),
        "value_loss": float(terms.value_loss.detach()),
        "entropy": float(terms.entropy.detach()),
        "approx_kl": float(kl),
        "clip_fraction": float(terms.clip_fraction),
        "samples": float(samples),
    }


def ppo_gradient(
    policy: ActorCritic,
    data: PPORound,
    task: Task,
    cfg: PPOConfig,
    *,
    others: Sequence[ActorCritic] = (),
    kl_coef: float | None = None,
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """PPO gradient of one minibatch of the round (advantages by GAE over each whole batch)."""
    idx = _minibatch_index(len(data.obs), task)
    o, act, mu = data.obs[idx], data.actions[idx], data.behaviour_log_probs[idx]
    advantages, returns = data.advantages[idx], data.returns[idx]
    if cfg.normalize_advantages and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    new_logp, entropy, values = policy.evaluate(o, act)
    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        weights, stats = _is_weights(new_logp, others, o, act, mu, cfg.stellaris.rho)
    log_ratio = new_logp - mu
    kl = (log_ratio.exp() - 1) - log_ratio  # k3 estimator of KL(μ‖π_θ), per sample
    coef = cfg.kl_coef if kl_coef is None else kl_coef
    terms = ppo_loss(
        new_logp,
        mu,
        advantages,
        values,
        returns,
        entropy,
        kl,
        clip=cfg.clip,
        kl_coef=coef,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        is_weights=weights,
        truncation_form=cfg.stellaris.truncation_form,
        old_values=data.values[idx] if cfg.vf_clip is not None else None,
        vf_clip=cfg.vf_clip,
    )
    grads = _gradients(policy, terms.total, cfg.max_grad_norm)
    return grads, stats | _loss_stats(terms, kl=terms.approx_kl, samples=len(idx))


def impact_gradient(
    policy: ActorCritic,
    target: ActorCritic,
    batches: Sequence[Mapping[str, np.ndarray]],
    task: Task,
    cfg: IMPACTConfig,
    *,
    others: Sequence[ActorCritic] = (),
    kl_coef: float | None = None,
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """IMPACT gradient of one minibatch: a contiguous time chunk of every env, so V-trace runs in time order."""
    obs, actions, mu_logp, rewards, discounts, next_obs = [], [], [], [], [], []
    for b in batches:
        steps = len(b["rewards"])
        size = steps // task.num_minibatches
        lo, hi = task.minibatch * size, (task.minibatch + 1) * size
        o = _t(b["observations"])
        obs.append(o[lo:hi])
        actions.append(_t(b["actions"])[lo:hi])
        mu_logp.append(_t(b["behaviour_log_probs"])[lo:hi])
        rewards.append(_t(b["rewards"])[lo:hi])
        done = _t(b["terminations"])[lo:hi] | _t(b["truncations"])[lo:hi]
        discounts.append(cfg.gamma * (~done).float())
        next_obs.append(o[hi] if hi < steps else _t(b["last_observations"]))
    # Concatenate envs of all batches along the env axis: [T, N_total, ...].
    o, act, mu = torch.cat(obs, 1), torch.cat(actions, 1), torch.cat(mu_logp, 1)
    rew, disc, boot_obs = torch.cat(rewards, 1), torch.cat(discounts, 1), torch.cat(next_obs, 0)
    t_len, n = rew.shape
    flat_o, flat_a = _flat(o), _flat(act)
    new_logp, entropy, values = policy.evaluate(flat_o, flat_a)
    with torch.no_grad():
        target_dist = target.distribution(flat_o)
        target_logp = target_dist.log_prob(flat_a)
        bootstrap = policy.value(boot_obs)
    kl = torch.distributions.kl_divergence(target_dist, policy.distribution(flat_o))
    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        weights, stats = _is_weights(new_logp, others, flat_o, flat_a, _flat(mu), cfg.stellaris.rho)
        weights = weights.reshape(t_len, n)

    def tm(x: Tensor) -> Tensor:
        return x.reshape(t_len, n)

    terms = impact_loss(
        tm(new_logp),
        tm(target_logp),
        mu,
        rew,
        tm(values),
        bootstrap,
        disc,
        tm(entropy),
        tm(kl),
        clip=cfg.clip,
        kl_coef=cfg.kl_coef if kl_coef is None else kl_coef,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        is_weights=weights,
    )
    grads = _gradients(policy, terms.total, cfg.max_grad_norm)
    return grads, stats | _loss_stats(terms, kl=terms.mean_kl, samples=t_len * n)


OBS_MOMENTS = ("_obs_mean", "_obs_var", "_obs_count")


def obs_moments(policy: ActorCritic, batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Tensor]:
    """Mean, variance and count of the encoded observations of all `batches` (for the running normaliser)."""
    assert policy.obs_normalizer is not None
    with torch.no_grad():
        feats = torch.cat([policy.encoder(_flat(_t(b["observations"]))) for b in batches])
    mean, var, count = batch_moments(feats, policy.obs_normalizer.mean.shape)
    return {"_obs_mean": mean, "_obs_var": var, "_obs_count": torch.tensor(count, dtype=torch.float64)}
