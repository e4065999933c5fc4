"""Observation normalisation that travels with the policy: running moments kept as buffers in its state_dict."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def batch_moments(x: Tensor, shape: Sequence[int]) -> tuple[Tensor, Tensor, float]:
    """(mean, population variance, count) of a batch of observations of `shape`."""
    batch = x.detach().reshape(-1, *shape).to(torch.float64)
    return batch.mean(dim=0), batch.var(dim=0, unbiased=False), float(batch.shape[0])


class RunningNormalizer(nn.Module):
    """Running mean/variance of observations, kept as buffers so they travel in the state_dict.

    ``forward`` returns clip((x − mean)/√(var + ε), ±clip); statistics change only through ``update``
    (parallel Welford, as Stable-Baselines3's ``RunningMeanStd``).
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: Sequence[int], *, epsilon: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.epsilon = epsilon
        self.clip = clip
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        self.update_from_moments(*batch_moments(x, self.mean.shape))

    @torch.no_grad()
    def update_from_moments(self, batch_mean: Tensor, batch_var: Tensor, batch_count: float) -> None:
        """Fold in a batch summarised elsewhere (a learner's minibatch), so stats travel without the batch."""
        batch_mean, batch_var = (m.to(self.mean.device, torch.float64) for m in (batch_mean, batch_var))
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        normalized = (x - self.mean) / torch.sqrt(self.var + self.epsilon)
        return torch.clamp(normalized, -self.clip, self.clip).to(x.dtype)
