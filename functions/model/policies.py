"""Actor-critic policy networks (Stellaris paper Table II, docs/architecture.md).

MuJoCo: actor and critic each two fully connected layers (256 wide by default), tanh, Gaussian actions with a
state-independent log-std. Atari: conv 16@8×8 s4 → 32@4×4 s2 → 256@11×11, ReLU, on 3 stacked 84×84 uint8
frames scaled to [0, 1] (the first two convolutions pad "same", as RLlib does, so 84 → 21 → 11 → 1);
categorical actions; the critic has the same shape on its own trunk. ``build_policy`` covers any Gymnasium
Box or Discrete action space. Every policy has one interface: ``distribution``, ``value``, ``act``,
``evaluate``, and ``sampler`` (``act`` for stepping envs, without distribution objects). Observations are batched,
``[B, *obs_shape]``.

The layers live in ``functions.model.networks``, the observation normaliser in ``functions.model.normalizers`` and the
fast
``act`` path in ``functions.actor.sampler``; this module assembles them into policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from functions.actor.sampler import Sampler
from functions.model.networks import Activation, FlattenObs, OneHotObs, ScaleImage, atari_trunk, init_layer, mlp
from functions.model.normalizers import RunningNormalizer

PolicyKind = Literal["auto", "mlp", "atari"]
ActionKind = Literal["gaussian", "categorical"]


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
        self.card: dict[str, Any] = {}  # build_policy's arguments as JSON: a saved policy says what rebuilds it

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

    def sampler(self, generator: torch.Generator | None = None) -> Sampler:
        """``act(obs)`` for stepping envs, fast (see ``Sampler``), drawing from `generator` (None: torch's global
        RNG); take a new one after the policy changes."""
        return Sampler(self, generator)


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
        ScaleImage(scale),
        nn.Sequential(actor_trunk, init_layer(nn.Linear(width, action_dim), 0.01)),
        nn.Sequential(critic_trunk, init_layer(nn.Linear(width, 1), 1.0)),
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
        FlattenObs(), obs_dim, "gaussian", action_dim, hidden=hidden, activation=activation, normalize_obs=normalize_obs
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
    policy = _network(
        observation_space, action_space, hidden=hidden, kind=kind, activation=activation, normalize_obs=normalize_obs
    )
    network = {"kind": kind, "hidden": list(hidden), "activation": activation, "normalize_obs": normalize_obs}
    policy.card = {
        "network": network,
        "observation_space": space_to_json(observation_space),
        "action_space": space_to_json(action_space),
    }
    return policy


def _network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    *,
    hidden: Sequence[int] = (256, 256),
    kind: PolicyKind = "auto",
    activation: Activation = "tanh",
    normalize_obs: bool = False,
) -> ActorCritic:
    """build_policy without the card."""
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
        encoder, obs_dim = OneHotObs(int(observation_space.n)), int(observation_space.n)
    elif isinstance(observation_space, spaces.Box):
        encoder, obs_dim = FlattenObs(), math.prod(observation_space.shape)
    else:
        raise TypeError(f"unsupported observation space {observation_space}: use Box or Discrete")
    return _mlp_policy(
        encoder, obs_dim, action_kind, action_dim, hidden=hidden, activation=activation, normalize_obs=normalize_obs
    )


# -- a policy's card: JSON that rebuilds it (with its state_dict: weights and observation statistics) -----------------
def _json_number(x: Any) -> Any:
    """JSON has no ±inf: non-finite bounds travel as the strings numpy reads back ("inf", "-inf")."""
    if isinstance(x, list):
        return [_json_number(v) for v in x]
    return x if math.isfinite(x) else str(float(x))


def _bound(values: np.ndarray) -> Any:
    """A Box bound as JSON: one number when uniform (an image's 0..255), else nested lists."""
    flat = values.reshape(-1).tolist()
    return _json_number(flat[0] if flat and all(x == flat[0] for x in flat) else values.tolist())


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """A Box or Discrete space as JSON (shape, dtype, bounds; or n and start)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        low, high = (_bound(np.asarray(b)) for b in (space.low, space.high))
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype), "low": low, "high": high}
    raise TypeError(f"unsupported space {space}: use Box or Discrete")


def space_from_json(data: dict[str, Any]) -> spaces.Space:
    """The space `space_to_json` described; a ValueError names what is missing or wrong."""
    try:
        if data["type"] == "Discrete":
            return spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
        if data["type"] == "Box":
            dtype = np.dtype(data["dtype"])
            low, high = (np.asarray(data[b], dtype=np.float64).astype(dtype) for b in ("low", "high"))
            bounds = [b.item() if b.ndim == 0 else b for b in (low, high)]  # a uniform bound is one number
            return spaces.Box(low=bounds[0], high=bounds[1], shape=tuple(data["shape"]), dtype=dtype)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad space description {data!r}: {exc!r}") from exc
    raise ValueError(f"bad space description {data!r}: type must be Box or Discrete")


def policy_from_card(card: dict[str, Any]) -> ActorCritic:
    """A fresh policy of the architecture `card` (``ActorCritic.card``) describes; load its state_dict next."""
    network = card["network"]
    return build_policy(
        space_from_json(card["observation_space"]),
        space_from_json(card["action_space"]),
        hidden=tuple(network["hidden"]),
        kind=network["kind"],
        activation=network["activation"],
        normalize_obs=bool(network["normalize_obs"]),
    )
