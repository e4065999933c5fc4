"""IMPACT behind the seam: one contiguous time chunk per task for V-trace against the target network, which is
refreshed at round boundaries (loss math in ``impact``, ``vtrace``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from contract import AggregatorState
from contract.algo_config import APPOConfig, IMPACTConfig
from contract.records import LearnerTask
from functions.algos.algorithm import Algorithm, Gradient, LearnInputs, refresh_target, reset_round_kl
from functions.algos.impact import impact_loss
from functions.algos.replay_priority import replay_priority_stats
from functions.learner.learn import Batch, flat, gradients, is_weights, loss_stats, sample_weights, time_chunk
from functions.model.policies import ActorCritic


def prepare(batches: Sequence[Batch], cfg: IMPACTConfig | APPOConfig) -> tuple[Batch, ...]:
    """The round's batches as they are: each task slices its own time chunk."""
    return tuple(batches)


def gradient(
    policy: ActorCritic, data: tuple[Batch, ...], task: LearnerTask, cfg: IMPACTConfig, inputs: LearnInputs
) -> Gradient:
    """IMPACT gradient of one minibatch: a contiguous time chunk of every env, so V-trace runs in time order."""
    chunk = time_chunk(data, task, gamma=cfg.gamma)
    target = inputs.target if inputs.target is not None else policy
    t_len, n = chunk.shape
    flat_o, flat_a = flat(chunk.obs), flat(chunk.actions)
    new_logp, entropy, values = policy.evaluate(flat_o, flat_a)
    with torch.no_grad():
        target_dist = target.distribution(flat_o)
        target_logp = target_dist.log_prob(flat_a)
        bootstrap = policy.value(chunk.bootstrap_obs)
    kl = torch.distributions.kl_divergence(target_dist, policy.distribution(flat_o))
    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        mu = flat(chunk.behaviour_log_probs)
        weights, stats = is_weights(new_logp, inputs.others, flat_o, flat_a, mu, cfg.stellaris.rho)
        weights = chunk.time_major(weights)
    tm = chunk.time_major
    terms = impact_loss(
        tm(new_logp),
        tm(target_logp),
        chunk.behaviour_log_probs,
        chunk.rewards,
        tm(values),
        bootstrap,
        chunk.discounts,
        tm(entropy),
        tm(kl),
        clip=cfg.clip,
        kl_coef=cfg.kl_coef if inputs.kl_coef is None else inputs.kl_coef,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        is_weights=weights,
        sample_weights=sample_weights(task, data, chunk),  # prioritized replay's importance weights
    )
    grads = gradients(policy, terms.total, cfg.max_grad_norm)
    return grads, stats | loss_stats(terms, kl=terms.mean_kl, samples=t_len * n) | replay_priority_stats(
        cfg, terms.pg_advantages, data
    )


def start_round(
    state: AggregatorState, cfg: IMPACTConfig | APPOConfig, *, new_round: int, version: int
) -> AggregatorState:
    """Refresh the target network every `target_update_frequency` rounds (IMPACT and APPO)."""
    state = reset_round_kl(state, new_round)
    return refresh_target(state, new_round=new_round, version=version, every=cfg.target_update_frequency)


def uses_target(cfg: IMPACTConfig) -> bool:
    return True  # V-trace and the surrogate are taken w.r.t. the target network


IMPACT = Algorithm("impact", IMPACTConfig, prepare, gradient, start_round, uses_target)
