"""Actor-critic policy networks (Stellaris paper Table II, SPEC.md §3).

MuJoCo: actor and critic each two fully connected layers (256 wide by default), tanh, Gaussian actions with a
state-independent log-std. Atari: conv 16@8×8 s4 → 32@4×4 s2 → 256@11×11, ReLU, on 3 stacked 84×84 uint8
frames scaled to [0, 1] (the first two convolutions pad "same", as RLlib does, so 84 → 21 → 11 → 1);
categorical actions; the critic has the same shape on its own trunk. ``build_policy`` covers any Gymnasium
Box or Discrete action space. Every policy has one interface: ``distribution``, ``value``, ``act``,
``evaluate``, and ``sampler`` (``act`` for stepping envs, without distribution objects). Observations are batched,
``[B, *obs_shape]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Independent, Normal
from torch.nn import functional as F

PolicyKind = Literal["auto", "mlp", "atari"]
Activation = Literal["tanh", "relu"]
ActionKind = Literal["gaussian", "categorical"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


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
        batch_mean, batch_var = batch_mean.to(torch.float64), batch_var.to(torch.float64)
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        normalized = (x - self.mean) / torch.sqrt(self.var + self.epsilon)
        return torch.clamp(normalized, -self.clip, self.clip).to(x.dtype)


class _Flatten(nn.Module):
    """Vector observations as float32 ``[B, D]``."""

    def forward(self, obs: Tensor) -> Tensor:
        return obs.to(torch.float32).flatten(start_dim=1)


class _OneHot(nn.Module):
    """Discrete observations as one-hot float32 ``[B, n]``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, obs: Tensor) -> Tensor:
        return nn.functional.one_hot(obs.long().reshape(-1), self.n).to(torch.float32)


class _ScaleImage(nn.Module):
    """Image observations as float32, uint8 frames scaled to [0, 1]."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, obs: Tensor) -> Tensor:
        return obs.to(torch.float32) * self.scale


def _init(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights, zero biases (CleanRL's ``layer_init``)."""
    if isinstance(layer, nn.Linear | nn.Conv2d):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, activation: Activation, out_gain: float) -> nn.Sequential:
    """Fully connected layers of widths ``hidden`` with ``activation``, then a linear output layer."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_init(nn.Linear(in_dim, width), math.sqrt(2)), _ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(_init(nn.Linear(in_dim, out_dim), out_gain))
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
            _init(nn.Conv2d(channels, out_channels, kernel, stride), math.sqrt(2)),
            nn.ReLU(),
        ]
        channels = out_channels
    last_kernel = (min(11, height), min(11, width))
    layers += [_init(nn.Conv2d(channels, 256, last_kernel), math.sqrt(2)), nn.ReLU(), nn.Flatten()]
    out_height, out_width = height - last_kernel[0] + 1, width - last_kernel[1] + 1
    return nn.Sequential(*layers), 256 * out_height * out_width


class ActorCritic(nn.Module):
    """Actor and critic on separate trunks over a shared, parameter-free observation encoder.

    ``actor`` maps encoded observations to the action mean (Gaussian; the log-std is one free parameter
    vector) or to the logits (categorical); ``critic`` maps them to one value.
    """

    def __init__(
        self,
        encoder: nn.Module,
        actor: nn.Module,
        critic: nn.Module,
        *,
        action_kind: ActionKind,
        action_dim: int,
        obs_normalizer: RunningNormalizer | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.obs_normalizer = obs_normalizer
        self.actor = actor
        self.critic = critic
        self.action_kind = action_kind
        self.action_dim = action_dim
        self.log_std = nn.Parameter(torch.zeros(action_dim)) if action_kind == "gaussian" else None

    def _features(self, obs: Tensor) -> Tensor:
        features = self.encoder(obs)
        return features if self.obs_normalizer is None else self.obs_normalizer(features)

    def _distribution(self, features: Tensor) -> Distribution:
        out = self.actor(features)
        if self.log_std is None:
            return Categorical(logits=out)
        return Independent(Normal(out, self.log_std.expand_as(out).exp()), 1)

    def distribution(self, obs: Tensor) -> Distribution:
        """π(·|s) for a batch of observations; ``log_prob`` and ``entropy`` are per sample, ``[B]``."""
        return self._distribution(self._features(obs))

    def value(self, obs: Tensor) -> Tensor:
        """V(s), ``[B]``."""
        return self.critic(self._features(obs)).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: Tensor, *, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Sample (or take the mode of) π(·|s): ``(action, log_prob, value)`` without gradient."""
        features = self._features(obs)
        dist = self._distribution(features)
        if not deterministic:
            action = dist.sample()
        elif isinstance(dist, Categorical):
            action = dist.probs.argmax(dim=-1)
        else:
            action = dist.mean
        return action, dist.log_prob(action), self.critic(features).squeeze(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(log π(a|s), entropy of π(·|s), V(s))`` with gradient, each ``[B]``."""
        features = self._features(obs)
        dist = self._distribution(features)
        return dist.log_prob(actions), dist.entropy(), self.critic(features).squeeze(-1)

    def update_obs_normalizer(self, obs: Tensor) -> None:
        """Fold a batch of observations into the running statistics (no-op when normalisation is off)."""
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(self.encoder(obs))

    def sampler(self) -> Sampler:
        """``act(obs)`` for stepping envs, fast (see ``Sampler``); take a new one after the policy changes."""
        return Sampler(self)


def _plain_calls(module: nn.Module) -> list[Callable[[Tensor], Tensor]]:
    """`module`'s forward as a list of plain tensor calls: Sequentials flattened, Linear/Tanh/ReLU/_Flatten as
    the functions they compute (no per-module dispatch); anything else is called as a module."""
    if isinstance(module, nn.Sequential):
        return [call for child in module for call in _plain_calls(child)]
    if isinstance(module, nn.Linear):
        return [partial(F.linear, weight=module.weight, bias=module.bias)]
    if isinstance(module, nn.Tanh):
        return [torch.tanh]
    if isinstance(module, nn.ReLU):
        return [torch.relu]
    if isinstance(module, _Flatten):
        return [partial(Tensor.to, dtype=torch.float32), partial(Tensor.flatten, start_dim=1)]
    return [module]


def _run(calls: list[Callable[[Tensor], Tensor]], x: Tensor) -> Tensor:
    for call in calls:
        x = call(x)
    return x


class Sampler:
    """``ActorCritic.act`` (sampling) with plain tensor math under ``torch.inference_mode``: no distribution
    objects, no module dispatch, the state-independent terms computed once. The same RNG calls as ``act``
    (``torch.normal`` / ``torch.multinomial`` on the same arguments), so the same samples for the same seed,
    and log-probs by the same formulas as ``Normal``/``Categorical``:

        Gaussian:    log π(a|s) = Σ_d −(a_d − μ_d)²/(2σ_d²) − log σ_d − ½ log 2π
        categorical: log π(a|s) = log_softmax(logits)[a]

    σ and the normaliser's statistics are a snapshot: take a new sampler whenever the policy changes (weights
    loaded, an optimiser step, a normaliser update). Outputs are inference tensors, outside autograd.
    """

    def __init__(self, policy: ActorCritic) -> None:
        self.encode = _plain_calls(policy.encoder)
        self.actor = _plain_calls(policy.actor)
        self.critic = _plain_calls(policy.critic)
        self.normalizer: tuple[Tensor, Tensor, float] | None = None  # mean, √(var + ε), clip
        self.gaussian: tuple[Tensor, Tensor, Tensor] | None = None  # σ, log σ, 2σ²
        with torch.inference_mode():
            if policy.obs_normalizer is not None:
                norm = policy.obs_normalizer
                self.normalizer = (norm.mean.clone(), torch.sqrt(norm.var + norm.epsilon), norm.clip)
            if policy.log_std is not None:
                std = policy.log_std.exp()
                self.gaussian = (std, std.log(), 2 * std**2)  # log σ as Normal takes it: the log of exp(log_std)
        self.log_sqrt_2pi = math.log(math.sqrt(2 * math.pi))

    @torch.inference_mode()
    def __call__(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(action, log_prob, value)`` for a batch of observations, as ``act(obs)``."""
        features = _run(self.encode, obs)
        if self.normalizer is not None:
            mean, std, clip = self.normalizer
            features = torch.clamp((features - mean) / std, -clip, clip).to(features.dtype)
        out = _run(self.actor, features)
        if self.gaussian is None:
            log_pmf = out - out.logsumexp(dim=-1, keepdim=True)
            action = torch.multinomial(torch.softmax(log_pmf, dim=-1), 1, True)
            log_prob = log_pmf.gather(-1, action).squeeze(-1)
            action = action.squeeze(-1)
        else:
            std, log_std, two_var = self.gaussian
            action = torch.normal(out, std.expand_as(out))
            log_prob = (-((action - out) ** 2) / two_var - log_std - self.log_sqrt_2pi).sum(-1)
        return action, log_prob, _run(self.critic, features).squeeze(-1)


def _mlp_policy(
    encoder: nn.Module,
    obs_dim: int,
    action_kind: ActionKind,
    action_dim: int,
    *,
    hidden: Sequence[int],
    activation: Activation,
    normalize_obs: bool,
) -> ActorCritic:
    return ActorCritic(
        encoder,
        mlp(obs_dim, hidden, action_dim, activation=activation, out_gain=0.01),
        mlp(obs_dim, hidden, 1, activation=activation, out_gain=1.0),
        action_kind=action_kind,
        action_dim=action_dim,
        obs_normalizer=RunningNormalizer((obs_dim,)) if normalize_obs else None,
    )


def _conv_policy(
    obs_shape: Sequence[int], action_kind: ActionKind, action_dim: int, *, scale: float, normalize_obs: bool
) -> ActorCritic:
    actor_trunk, width = atari_trunk(obs_shape)
    critic_trunk, _ = atari_trunk(obs_shape)
    return ActorCritic(
        _ScaleImage(scale),
        nn.Sequential(actor_trunk, _init(nn.Linear(width, action_dim), 0.01)),
        nn.Sequential(critic_trunk, _init(nn.Linear(width, 1), 1.0)),
        action_kind=action_kind,
        action_dim=action_dim,
        obs_normalizer=RunningNormalizer(obs_shape) if normalize_obs else None,
    )


def mujoco_actor_critic(
    obs_dim: int,
    action_dim: int,
    *,
    hidden: Sequence[int] = (256, 256),
    activation: Activation = "tanh",
    normalize_obs: bool = False,
) -> ActorCritic:
    """Paper Table II MuJoCo policy: Gaussian actor and critic, each ``hidden`` FC layers with tanh."""
    return _mlp_policy(
        _Flatten(), obs_dim, "gaussian", action_dim, hidden=hidden, activation=activation, normalize_obs=normalize_obs
    )


def atari_actor_critic(obs_shape: Sequence[int], num_actions: int) -> ActorCritic:
    """Paper Table II Atari policy on uint8 frames: categorical actor and critic, each on its own conv trunk."""
    return _conv_policy(obs_shape, "categorical", num_actions, scale=1 / 255, normalize_obs=False)


def build_policy(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    *,
    hidden: Sequence[int] = (256, 256),
    kind: PolicyKind = "auto",
    activation: Activation = "tanh",
    normalize_obs: bool = False,
) -> ActorCritic:
    """An actor-critic for a Gymnasium Box/Discrete observation space and a Box/Discrete action space.

    ``auto`` picks the Atari conv net for 3-D uint8 Box observations (channel-first, ``[C, H, W]``) and
    MLPs otherwise (Discrete observations are one-hot encoded). Box actions get a Gaussian head (actions
    are not squashed; clip them in the actor), Discrete actions a categorical one.
    """
    action_kind: ActionKind
    if isinstance(action_space, spaces.Discrete):
        action_kind, action_dim = "categorical", int(action_space.n)
    elif isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        action_kind, action_dim = "gaussian", int(action_space.shape[0])
    else:
        raise TypeError(f"unsupported action space {action_space}: use Discrete or a 1-D Box")

    is_image = isinstance(observation_space, spaces.Box) and len(observation_space.shape) == 3
    is_uint8 = isinstance(observation_space, spaces.Box) and observation_space.dtype == "uint8"
    if kind == "auto":
        kind = "atari" if is_image and is_uint8 else "mlp"
    if kind == "atari":
        if not is_image:
            raise TypeError(f"the Atari network needs [C, H, W] Box observations, got {observation_space}")
        scale = 1 / 255 if is_uint8 else 1.0
        shape = tuple(observation_space.shape or ())
        return _conv_policy(shape, action_kind, action_dim, scale=scale, normalize_obs=normalize_obs)

    encoder: nn.Module
    if isinstance(observation_space, spaces.Discrete):
        encoder, obs_dim = _OneHot(int(observation_space.n)), int(observation_space.n)
    elif isinstance(observation_space, spaces.Box):
        encoder, obs_dim = _Flatten(), math.prod(observation_space.shape)
    else:
        raise TypeError(f"unsupported observation space {observation_space}: use Box or Discrete")
    return _mlp_policy(
        encoder, obs_dim, action_kind, action_dim, hidden=hidden, activation=activation, normalize_obs=normalize_obs
    )
