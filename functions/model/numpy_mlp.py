"""An MLP policy's parameters as NumPy arrays, with its forward pass and the backward pass written out: what the
learner's PPO gradient runs on the CPU (``functions.algos.ppo_numpy``), where per-op torch dispatch and autograd
bookkeeping cost more than the math at these sizes.

    Linear y = x·Wᵀ + b:  ∂W = δᵀ·x, ∂b = Σ δ, ∂x = δ·W;  tanh: δ·(1 − y²);  ReLU: δ·[y > 0]
    Gaussian log π = Σ −(a − m)²/(2σ²) − log σ − ½ log 2π;  categorical log π = z_a − logsumexp z

Only policies of Linear layers and one activation (``build_policy``'s MLPs) with float32 parameters on the CPU have
a `Net`: ``nets`` says None for any other (convolutions, a GPU, float64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np
import torch
from torch import nn

from contract.packed import PACKED, split
from functions.model.flat_params import flat_params
from functions.model.networks import FlattenObs, OneHotObs
from functions.model.policies import ActorCritic

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
F32 = np.float32


@dataclass(frozen=True)
class Shape:
    """What of a policy the array math needs: each trunk's Linear parameter names (weight, bias) in order, its
    activation, and how observations are encoded (None: flattened; n: one-hot over n)."""

    actor: tuple[tuple[str, str], ...]
    critic: tuple[tuple[str, str], ...]
    relu: bool
    one_hot: int | None
    sizes: tuple[tuple[str, tuple[int, ...]], ...]  # every parameter's name and shape: others must match


_SHAPES: WeakKeyDictionary[nn.Module, Shape | None] = WeakKeyDictionary()


def _trunk(prefix: str, module: nn.Module) -> tuple[tuple[tuple[str, str], ...], set[type]] | None:
    """A Sequential of Linear, activation, Linear, ..., Linear: its (weight, bias) names and its activations."""
    if not isinstance(module, nn.Sequential):
        return None
    children = list(module)
    linears, acts = children[0::2], children[1::2]
    if len(children) % 2 == 0 or not all(isinstance(m, nn.Linear) and m.bias is not None for m in linears):
        return None
    if not all(type(m) in (nn.Tanh, nn.ReLU) for m in acts):
        return None
    names = tuple((f"{prefix}.{i}.weight", f"{prefix}.{i}.bias") for i in range(0, len(children), 2))
    return names, {type(m) for m in acts}


def _shape(policy: ActorCritic) -> Shape | None:
    """The policy's `Shape` when it is an MLP of Linear layers and one activation, else None."""
    if not isinstance(policy.encoder, FlattenObs | OneHotObs):
        return None
    actor, critic = _trunk("actor", policy.actor), _trunk("critic", policy.critic)
    if actor is None or critic is None:
        return None
    acts = actor[1] | critic[1]
    if len(acts) > 1:
        return None
    one_hot = policy.encoder.n if isinstance(policy.encoder, OneHotObs) else None
    sizes = tuple((name, tuple(p.shape)) for name, p in policy.named_parameters())
    return Shape(actor[0], critic[0], acts == {nn.ReLU}, one_hot, sizes)


_ARRAYS: WeakKeyDictionary[nn.Module, tuple[object, dict[str, np.ndarray]]] = WeakKeyDictionary()


def _arrays(policy: ActorCritic) -> dict[str, np.ndarray] | None:
    """The policy's parameters by name as NumPy views (no copies: they follow in-place weight loads), or None when
    they are not float32 on the CPU. A packed policy's views are kept while its flat tensor stays the same."""
    fp = flat_params(policy)  # None too when the parameters no longer share its storage
    if fp is not None:
        hit = _ARRAYS.get(policy)
        if hit is not None and hit[0] is fp:
            return hit[1]
        if fp.flat.device.type != "cpu" or fp.flat.dtype != torch.float32:
            return None
        arrays = split(fp.flat.detach().numpy(), fp.layout)
        _ARRAYS[policy] = (fp, arrays)
        return arrays
    params = dict(policy.named_parameters())
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params.values()):
        return None
    return {name: p.detach().numpy() for name, p in params.items()}


def nets(policy: ActorCritic, others: Sequence[ActorCritic] = ()) -> list[Net] | None:
    """`policy`, then each of `others`, as `Net`s, or None when one has no `Net` or another shape than `policy`."""
    out = []
    for p in (policy, *others):
        if p not in _SHAPES:
            _SHAPES[p] = _shape(p)
        shape, arrays = _SHAPES[p], _arrays(p)
        if shape is None or arrays is None or shape != _SHAPES[policy]:
            return None
        out.append(Net(p, shape, arrays))
    return out


class Net:
    """One policy's parameters as NumPy arrays, its observation encoding and its forward and backward passes."""

    def __init__(self, policy: ActorCritic, shape: Shape, params: dict[str, np.ndarray]) -> None:
        self.actor = [(params[w], params[b]) for w, b in shape.actor]
        self.critic = [(params[w], params[b]) for w, b in shape.critic]
        self.log_std = params.get("log_std")
        self.shape = shape
        self.packed = flat_params(policy) is not None
        norm = policy.obs_normalizer
        self.norm = None
        if norm is not None:  # read each time: a normaliser's buffers may be replaced rather than updated
            self.norm = (norm.mean.numpy(), np.sqrt(norm.var.numpy() + norm.epsilon), norm.clip)

    def features(self, obs: np.ndarray) -> np.ndarray:
        if self.shape.one_hot is not None:
            x = np.eye(self.shape.one_hot, dtype=F32)[obs.reshape(-1).astype(np.int64)]
        else:
            x = obs.reshape(len(obs), -1).astype(F32, copy=False)
        if self.norm is not None:
            mean, std, clip = self.norm
            x = np.clip((x - mean) / std, -clip, clip).astype(F32)
        return x

    def forward(self, layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> list[np.ndarray]:
        """Each layer's input, then the output: what the backward pass reads."""
        out = [x]
        for i, (w, b) in enumerate(layers):
            y = x @ w.T + b
            if i < len(layers) - 1:
                y = np.maximum(y, 0) if self.shape.relu else np.tanh(y)
            out.append(y)
            x = y
        return out

    def backward(self, layers: list[tuple[np.ndarray, np.ndarray]], acts: list[np.ndarray], d: np.ndarray) -> list:
        """[∂W, ∂b] of each layer, in order, for ∂loss/∂output `d`."""
        grads: list[np.ndarray] = []
        for i in range(len(layers) - 1, -1, -1):
            grads += [d.sum(0), d.T @ acts[i]]
            if i > 0:
                h = acts[i]
                d = (d @ layers[i][0]) * ((h > 0) if self.shape.relu else (1 - h * h))
        return grads[::-1]

    def log_prob(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log π(a|s) alone (another learner's policy, with its own observation statistics, for R')."""
        out = self.forward(self.actor, self.features(obs))[-1]
        return log_prob_of(out, actions, self.log_std)[0]

    def pack(self, grads: dict[str, np.ndarray], max_grad_norm: float | None) -> dict[str, torch.Tensor]:
        """The gradient as `learn.gradients` returns it: one tensor in layout order for a packed policy, else by name;
        clipped to a total norm of `max_grad_norm`."""
        names = [name for name, _ in self.shape.sizes]  # named_parameters order: a packed policy's layout
        packed = np.concatenate([grads[name].reshape(-1) for name in names]).astype(F32, copy=False)
        if max_grad_norm is not None:
            norm = float(np.sqrt(np.dot(packed, packed)))
            packed *= F32(min(max_grad_norm / (norm + 1e-6), 1.0))
        flat = torch.from_numpy(packed)
        return {PACKED: flat} if self.packed else split(flat, self.shape.sizes)


def log_prob_of(out: np.ndarray, actions: np.ndarray, log_std: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(log π(a|s), and for the backward pass: (a − m)/σ² for a Gaussian, log p of every action for a categorical)."""
    if log_std is None:
        z = out - out.max(-1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return np.take_along_axis(log_p, actions.reshape(-1, 1).astype(np.int64), -1)[:, 0], log_p
    std = np.exp(log_std)
    diff = actions - out
    return (-(diff * diff) / (2 * std * std) - np.log(std) - LOG_SQRT_2PI).sum(-1), diff / (std * std)
