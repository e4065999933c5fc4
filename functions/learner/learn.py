"""The pieces every algorithm's gradient shares: minibatch selection, the Stellaris truncation weights, time-major
chunks for V-trace, the gradient itself and the observation moments. Arrays and policies in, tensors out. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from contract.packed import PACKED
from contract.records import LearnerTask as Task
from contract.records import ObsMoments
from functions.algos.stellaris import truncated_is_weight, truncation_stats
from functions.model.device import module_device
from functions.model.flat_params import flat_params
from functions.model.normalizers import batch_moments
from functions.model.policies import ActorCritic

Batch = Mapping[str, np.ndarray]


def as_tensor(a: np.ndarray | Tensor) -> Tensor:
    """A batch array as a tensor: a numpy array shared on the CPU, a tensor (already on the learner's device) as it
    is."""
    return a if isinstance(a, Tensor) else torch.as_tensor(np.asarray(a))


def flat(x: Tensor) -> Tensor:
    """[T, N, ...] -> [T·N, ...]."""
    return x.reshape(-1, *x.shape[2:])


def minibatch_index(total: int, task: Task, seed: int = 0) -> Tensor:
    """The task's slice of a permutation fixed by (job seed, round, epoch), so the minibatches of an epoch partition
    it, every learner draws the same one, and another seed shuffles differently."""
    g = torch.Generator().manual_seed((1_000_003 * task.round + task.epoch + 7_919_009 * seed) % 2**63)
    perm = torch.randperm(total, generator=g)
    size = total // task.num_minibatches
    return perm[task.minibatch * size : (task.minibatch + 1) * size]


def is_weights(
    own_logp: Tensor, others: Sequence[ActorCritic], obs: Tensor, actions: Tensor, behaviour_logp: Tensor, rho: float
) -> tuple[Tensor, dict[str, float]]:
    """R' (paper Eq. 2) against the policies other learners hold, and its statistics."""
    with torch.no_grad():
        other = [p.distribution(obs).log_prob(actions) for p in others]  # no critic or entropy: log-probs only
        other_logp = torch.stack(other) if other else own_logp.new_zeros((0, *own_logp.shape))
        weights = truncated_is_weight(own_logp.detach(), other_logp, behaviour_logp, rho=rho)
        stats = truncation_stats(own_logp.detach(), other_logp, behaviour_logp, rho=rho)
    return weights, {
        "truncated_fraction": stats.fraction_truncated,
        "mean_is_weight": stats.mean_weight,
        "other_policies": float(len(others)),
    }


def gradients(policy: ActorCritic, loss: Tensor, max_grad_norm: float | None) -> dict[str, Tensor]:
    """d loss / d parameters as fresh tensors (autograd.grad: no .grad buffers to zero or copy), clipped to a total
    norm of `max_grad_norm` as `clip_grad_norm_` does; packed in one tensor for a packed policy (`PACKED`)."""
    fp = flat_params(policy)
    named = list(policy.named_parameters()) if fp is None else []
    params = list(fp.views) if fp is not None else [p for _, p in named]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    out = [g if g is not None else torch.zeros_like(p) for p, g in zip(params, grads, strict=True)]
    if fp is not None:
        packed = torch.cat([g.reshape(-1) for g in out])
        if max_grad_norm is not None:
            packed.mul_(torch.clamp(max_grad_norm / (torch.linalg.vector_norm(packed) + 1e-6), max=1.0))
        return {PACKED: packed}
    if max_grad_norm is not None:
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(out)))
        torch._foreach_mul_(out, torch.clamp(max_grad_norm / (total + 1e-6), max=1.0))
    return {name: g for (name, _), g in zip(named, out, strict=True)}


class LossTerms(Protocol):
    """What every algorithm's named loss terms have (``PPOLossTerms``, ``IMPACTLossTerms``, ``APPOLossTerms``): read
    only, as those frozen dataclasses' fields are."""

    @property
    def total(self) -> Tensor: ...
    @property
    def policy_loss(self) -> Tensor: ...
    @property
    def value_loss(self) -> Tensor: ...
    @property
    def entropy(self) -> Tensor: ...
    @property
    def clip_fraction(self) -> Tensor: ...


def loss_stats(terms: LossTerms, *, kl: Tensor, samples: int) -> dict[str, float]:
    """The statistics every gradient reports (the parameter function adapts PPO's KL coefficient from approx_kl)."""
    return {
        "loss": float(terms.total.detach()),
        "policy_loss": float(terms.policy_loss.detach()),
        "value_loss": float(terms.value_loss.detach()),
        "entropy": float(terms.entropy.detach()),
        "approx_kl": float(kl),
        "clip_fraction": float(terms.clip_fraction),
        "samples": float(samples),
    }


@dataclass(frozen=True)
class TimeChunk:
    """One task's minibatch for V-trace: a contiguous time chunk of every env of the round's batches, envs of all
    batches side by side (``[T, N, ...]``), and the observation after each env's chunk (``[N, ...]``)."""

    obs: Tensor
    actions: Tensor
    behaviour_log_probs: Tensor
    rewards: Tensor
    discounts: Tensor
    bootstrap_obs: Tensor

    @property
    def shape(self) -> tuple[int, int]:
        t_len, n = self.rewards.shape
        return t_len, n

    def time_major(self, x: Tensor) -> Tensor:
        """[T·N, ...] (a flattened per-sample tensor) -> [T, N, ...]."""
        return x.reshape(*self.shape, *x.shape[1:])


def time_chunk(batches: Sequence[Batch], task: Task, *, gamma: float) -> TimeChunk:
    """The task's time chunk (minibatch i of m: steps [i·T/m, (i+1)·T/m) of each batch), so V-trace runs in time
    order; an episode end (terminated or truncated) cuts the discount to 0."""
    obs, actions, mu_logp, rewards, discounts, next_obs = [], [], [], [], [], []
    for b in batches:
        steps = len(b["rewards"])
        size = steps // task.num_minibatches
        lo, hi = task.minibatch * size, (task.minibatch + 1) * size
        o = as_tensor(b["observations"])
        obs.append(o[lo:hi])
        actions.append(as_tensor(b["actions"])[lo:hi])
        mu_logp.append(as_tensor(b["behaviour_log_probs"])[lo:hi])
        rewards.append(as_tensor(b["rewards"])[lo:hi])
        done = as_tensor(b["terminations"])[lo:hi] | as_tensor(b["truncations"])[lo:hi]
        discounts.append(gamma * (~done).float())
        next_obs.append(o[hi] if hi < steps else as_tensor(b["last_observations"]))
    return TimeChunk(
        torch.cat(obs, 1),
        torch.cat(actions, 1),
        torch.cat(mu_logp, 1),
        torch.cat(rewards, 1),
        torch.cat(discounts, 1),
        torch.cat(next_obs, 0),
    )


def column_weights(batch_weights: Sequence[float], columns: Sequence[int]) -> Tensor:
    """Per-batch weights over env columns ([N], float64): batch b's weight repeated over its `columns[b]` envs, the
    batches side by side in task order, as `time_chunk` concatenates them."""
    if len(batch_weights) != len(columns):
        raise ValueError(f"{len(batch_weights)} batch weights for {len(columns)} batches")
    return torch.repeat_interleave(torch.tensor(batch_weights, dtype=torch.float64), torch.tensor(columns))


def sample_weights(task: Task, batches: Sequence[Batch], chunk: TimeChunk) -> Tensor | None:
    """Prioritized replay's importance weight of each sample of the task's time chunk ([T, N], the chunk's dtype and
    device), or None when every batch weighs 1.0: the loss is then the unweighted one, bit for bit."""
    if all(w == 1.0 for w in task.weights):
        return None
    w = column_weights(task.weights, [int(b["rewards"].shape[1]) for b in batches]).to(chunk.rewards)
    return w.expand(chunk.shape)


def obs_moments(policy: ActorCritic, batches: Sequence[Batch]) -> ObsMoments:
    """Mean, variance and count of the encoded observations of all `batches` (for the running normaliser), on the
    policy's device."""
    assert policy.obs_normalizer is not None
    device = module_device(policy)
    with torch.no_grad():
        feats = torch.cat([policy.encoder(flat(as_tensor(b["observations"]).to(device))) for b in batches])
    mean, var, count = batch_moments(feats, policy.obs_normalizer.mean.shape)
    return ObsMoments(mean, var, count)
