"""Network building blocks of the policies (Stellaris paper Table II): parameter-free observation encoders,
fully connected stacks and the Atari conv trunk, initialised as CleanRL does (orthogonal weights, zero biases)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

Activation = Literal["tanh", "relu"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


class FlattenObs(nn.Module):
    """Vector observations as float32 ``[B, D]``."""

    dtype = torch.float32  # what every reader of the observations sees: the sampler and the rollout's storage use it

    def forward(self, obs: Tensor) -> Tensor:
        return obs.to(self.dtype).flatten(start_dim=1)


class OneHotObs(nn.Module):
    """Discrete observations as one-hot float32 ``[B, n]``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, obs: Tensor) -> Tensor:
        return nn.functional.one_hot(obs.long().reshape(-1), self.n).to(torch.float32)


class ScaleImage(nn.Module):
    """Image observations as float32, uint8 frames scaled to [0, 1]."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, obs: Tensor) -> Tensor:
        return obs.to(torch.float32) * self.scale


def init_layer(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights, zero biases (CleanRL's ``layer_init``)."""
    if isinstance(layer, nn.Linear | nn.Conv2d):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, activation: Activation, out_gain: float) -> nn.Sequential:
    """Fully connected layers of widths ``hidden`` with ``activation``, then a linear output layer."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [init_layer(nn.Linear(in_dim, width), math.sqrt(2)), _ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(init_layer(nn.Linear(in_dim, out_dim), out_gain))
    return nn.Sequential(*layers)


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow/RLlib "same" padding: (before, after, output size)."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2, out


def atari_trunk(obs_shape: Sequence[int]) -> tuple[nn.Sequential, int]:
    """Paper Table II conv trunk on ``[C, H, W]`` input: 16@8×8 s4, 32@4×4 s2, 256@11×11, ReLU.

    Returns the trunk and its flat output width (256 on 84×84 input).
    """
    channels, height, width = obs_shape
    layers: list[nn.Module] = []
    for out_channels, kernel, stride in ((16, 8, 4), (32, 4, 2)):
        top, bottom, height = _same_padding(height, kernel, stride)
        left, right, width = _same_padding(width, kernel, stride)
        layers += [
            nn.ZeroPad2d((left, right, top, bottom)),
            init_layer(nn.Conv2d(channels, out_channels, kernel, stride), math.sqrt(2)),
            nn.ReLU(),
        ]
        channels = out_channels
    last_kernel = (min(11, height), min(11, width))
    layers += [init_layer(nn.Conv2d(channels, 256, last_kernel), math.sqrt(2)), nn.ReLU(), nn.Flatten()]
    out_height, out_width = height - last_kernel[0] + 1, width - last_kernel[1] + 1
    return nn.Sequential(*layers), 256 * out_height * out_width
