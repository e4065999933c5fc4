"""APPO behind the seam: one contiguous time chunk per task for V-trace against the learner policy, PPO's clip on
π_θ/μ, an optional KL to a target network refreshed at round boundaries (loss math in ``appo``, ``vtrace``)."""

from __future__ import annotations

import torch

from contract.algo_config import APPOConfig
from contract.records import LearnerTask
from functions.algos import impact_algo
from functions.algos.algorithm import Algorithm, Gradient, LearnInputs
from functions.algos.appo import appo_loss
from functions.algos.replay_priority import replay_priority_stats
from functions.learner.learn import Batch, flat, gradients, is_weights, loss_stats, sample_weights, time_chunk
from functions.model.policies import ActorCritic


def gradient(
    policy: ActorCritic, data: tuple[Batch, ...], task: LearnerTask, cfg: APPOConfig, inputs: LearnInputs
) -> Gradient:
    """APPO gradient of one minibatch: a contiguous time chunk of every env, so V-trace runs in time order."""
    chunk = time_chunk(data, task, gamma=cfg.gamma)
    t_len, n = chunk.shape
    flat_o, flat_a, flat_mu = flat(chunk.obs), flat(chunk.actions), flat(chunk.behaviour_log_probs)
    new_logp, entropy, values = policy.evaluate(flat_o, flat_a)
    with torch.no_grad():
        bootstrap = policy.value(chunk.bootstrap_obs)
    kl = None
    if cfg.kl_coef > 0:
        target = inputs.target if inputs.target is not None else policy
        with torch.no_grad():
            target_dist = target.distribution(flat_o)
        kl = chunk.time_major(torch.distributions.kl_divergence(target_dist, policy.distribution(flat_o)))
    stats: dict[str, float] = {}
    weights = None
    if cfg.stellaris.truncation:
        weights, stats = is_weights(new_logp, inputs.others, flat_o, flat_a, flat_mu, cfg.stellaris.rho)
        weights = chunk.time_major(weights)
    tm = chunk.time_major
    terms = appo_loss(
        tm(new_logp),
        chunk.behaviour_log_probs,
        chunk.rewards,
        tm(values),
        bootstrap,
        chunk.discounts,
        tm(entropy),
        kl,
        clip=cfg.clip,
        kl_coef=cfg.kl_coef if inputs.kl_coef is None else inputs.kl_coef,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        normalize_advantages=cfg.normalize_advantages,
        is_weights=weights,
        truncation_form=cfg.stellaris.truncation_form,
        sample_weights=sample_weights(task, data, chunk),
    )
    grads = gradients(policy, terms.total, cfg.max_grad_norm)
    return grads, stats | loss_stats(terms, kl=terms.approx_kl, samples=t_len * n) | replay_priority_stats(
        cfg, terms.pg_advantages, data
    )


def uses_target(cfg: APPOConfig) -> bool:
    return cfg.kl_coef > 0  # only the KL term reads the target network


# A round's data and its boundary are IMPACT's (the batches as they are, time chunks per task; the target network
# refreshed every `target_update_frequency` rounds, which APPO reads only when ``kl_coef`` > 0).
APPO = Algorithm("appo", APPOConfig, impact_algo.prepare, gradient, impact_algo.start_round, uses_target)
