"""PPO behind the seam: GAE once per round, one shuffled minibatch per task, the adaptive KL coefficient at each
round boundary (loss math in ``ppo``, ``gae``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from contract import AggregatorState
from contract.algo_config import PPOConfig
from contract.records import LearnerTask
from functions.algos import ppo_numpy
from functions.algos.algorithm import Algorithm, Gradient, LearnInputs, reset_round_kl
from functions.algos.gae import gae
from functions.algos.ppo import adaptive_kl_coef, ppo_loss
from functions.algos.ppo_round import PPORound, Rollout
from functions.learner.learn import Batch, as_tensor, flat, gradients, is_weights, loss_stats, minibatch_index
from functions.model.policies import ActorCritic


def prepare(batches: Sequence[Batch], cfg: PPOConfig) -> PPORound:
    parts: dict[str, list[Tensor]] = {k: [] for k in ("obs", "act", "mu", "adv", "ret", "val")}
    rollouts = []
    for b in batches:
        rollout = Rollout(
            as_tensor(b["rewards"]),
            as_tensor(b["last_values"]),
            as_tensor(b["terminations"]),
            as_tensor(b["truncations"]),
            as_tensor(b["truncation_values"]),
        )
        values = as_tensor(b["values"])
        a, r = _gae(rollout, values, cfg)
        rollouts.append(rollout)
        parts["obs"].append(flat(as_tensor(b["observations"])))
        parts["act"].append(flat(as_tensor(b["actions"])))
        parts["mu"].append(flat(as_tensor(b["behaviour_log_probs"])))
        parts["adv"].append(flat(a))
        parts["ret"].append(flat(r))
        parts["val"].append(flat(values))
    c = {k: torch.cat(v) for k, v in parts.items()}
    kept = tuple(rollouts) if cfg.recompute_values else ()
    return PPORound(c["obs"], c["act"], c["mu"], c["adv"], c["ret"], c["val"], rollouts=kept)


def _gae(r: Rollout, values: Tensor, cfg: PPOConfig) -> tuple[Tensor, Tensor]:
    return gae(
        r.rewards,
        values,
        r.bootstrap_value,
        r.terminations,
        r.truncations,
        gamma=cfg.gamma,
        lam=cfg.lam,
        truncation_values=r.truncation_values,
    )


def with_values(data: PPORound, values: Tensor, cfg: PPOConfig) -> PPORound:
    """The round's advantages and returns by GAE again, from `values` (flat, in the round's sample order)."""
    adv, ret, start = [], [], 0
    for rollout in data.rollouts:
        shape = rollout.rewards.shape
        n = shape.numel()
        a, r = _gae(rollout, values[start : start + n].reshape(shape).to(rollout.rewards.dtype), cfg)
        adv.append(flat(a))
        ret.append(flat(r))
        start += n
    if start != len(values):
        raise ValueError(f"{len(values)} values for a round of {start} samples")
    return replace(data, advantages=torch.cat(adv), returns=torch.cat(ret), values=values)


@torch.no_grad()
def with_proximal(data: PPORound, policy: ActorCritic, cfg: PPOConfig) -> PPORound:
    """The decoupled clip's proximal policy is the first one this instance trains the round with: like plain PPO's
    π_old, which is the policy at the round's start, while μ can be up to a round older (actors run ahead). With
    `recompute_values`, that policy's values also replace the actors' in GAE."""
    decoupled = cfg.stellaris.truncation_form == "decoupled"
    if not decoupled and not data.rollouts:
        return data
    log_probs, _, values = policy.evaluate(data.obs, data.actions)
    if data.rollouts:
        data = with_values(data, values.reshape(-1), cfg)
    return replace(data, proximal_log_probs=log_probs) if decoupled else data


def gradient(policy: ActorCritic, data: PPORound, task: LearnerTask, cfg: PPOConfig, inputs: LearnInputs) -> Gradient:
    """PPO gradient of one minibatch of the round (advantages by GAE over each whole batch)."""
    idx = minibatch_index(len(data.obs), task, inputs.seed).to(data.obs.device)  # drawn on the CPU: same on any device
    kl_coef = cfg.kl_coef if inputs.kl_coef is None else inputs.kl_coef
    nets = ppo_numpy.plan(policy, inputs.others) if data.obs.device.type == "cpu" else None
    if nets is not None:  # an MLP on the CPU: the same gradient as array math, without autograd's overhead
        return ppo_numpy.gradient(nets, data, idx, cfg, kl_coef)
    o, act, mu = data.obs[idx], data.actions[idx], data.behaviour_log_probs[idx]
    advantages, returns = data.advantages[idx], data.returns[idx]
    if cfg.normalize_advantages and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    new_logp, entropy, values = policy.evaluate(o, act)
    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        weights, stats = is_weights(new_logp, inputs.others, o, act, mu, cfg.stellaris.rho)
    log_ratio = new_logp - mu
    kl = (log_ratio.exp() - 1) - log_ratio  # k3 estimator of KL(μ‖π_θ), per sample
    terms = ppo_loss(
        new_logp,
        mu,
        advantages,
        values,
        returns,
        entropy,
        kl,
        clip=cfg.clip,
        kl_coef=kl_coef,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        is_weights=weights,
        truncation_form=cfg.stellaris.truncation_form,
        old_values=data.values[idx] if cfg.vf_clip is not None else None,
        vf_clip=cfg.vf_clip,
        proximal_log_probs=None if data.proximal_log_probs is None else data.proximal_log_probs[idx],
    )
    grads = gradients(policy, terms.total, cfg.max_grad_norm)
    return grads, stats | loss_stats(terms, kl=terms.approx_kl, samples=len(idx))


def start_round(state: AggregatorState, cfg: PPOConfig, *, new_round: int, version: int) -> AggregatorState:
    """Adapt the KL coefficient to the KL the last round's gradients observed (RLlib's rule)."""
    if cfg.kl_coef > 0 and state.kl_n > 0:
        coef = cfg.kl_coef if state.kl_coef is None else state.kl_coef
        state = state.with_(kl_coef=adaptive_kl_coef(coef, state.kl_sum / state.kl_n, target=cfg.kl_target))
    return reset_round_kl(state, new_round)


PPO = Algorithm("ppo", PPOConfig, prepare, gradient, start_round, with_policy=with_proximal)
