"""Policy networks: shapes on real spaces, log-prob consistency, the observation normaliser."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import kl_divergence

from functions.model.normalizers import RunningNormalizer
from functions.model.policies import atari_actor_critic, build_policy, mujoco_actor_critic

ATARI_OBS = spaces.Box(0, 255, (3, 84, 84), np.uint8)


@pytest.fixture(scope="module")
def hopper_spaces() -> tuple[spaces.Space, spaces.Space]:
    env = gym.make("Hopper-v5")
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _obs(space: spaces.Space, batch: int, seed: int = 0) -> torch.Tensor:
    space.seed(seed)
    return torch.as_tensor(np.stack([space.sample() for _ in range(batch)]))


def test_hopper_policy_shapes(hopper_spaces: tuple[spaces.Space, spaces.Space]) -> None:
    torch.manual_seed(0)
    observation_space, action_space = hopper_spaces
    policy = build_policy(observation_space, action_space)
    assert policy.action_kind == "gaussian" and policy.action_dim == 3
    # Table II: actor and critic each two FC layers of 256, tanh; separate trunks
    linear = [m for m in policy.actor if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(11, 256), (256, 256), (256, 3)]
    assert sum(isinstance(m, torch.nn.Tanh) for m in policy.critic) == 2
    assert policy.log_std is not None and policy.log_std.shape == (3,)
    obs = _obs(observation_space, 5)
    action, log_prob, value = policy.act(obs)
    assert action.shape == (5, 3) and log_prob.shape == (5,) and value.shape == (5,)
    assert not log_prob.requires_grad
    log_prob2, entropy, value2 = policy.evaluate(obs, action)
    assert log_prob2.requires_grad and entropy.shape == (5,)
    torch.testing.assert_close(log_prob2.detach(), log_prob)
    torch.testing.assert_close(value2.detach(), value)


def test_gaussian_log_prob_and_entropy_by_hand() -> None:
    torch.manual_seed(1)
    policy = mujoco_actor_critic(4, 2, hidden=(8,))
    assert policy.log_std is not None
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([0.0, math.log(2.0)]))
    obs = torch.randn(3, 4)
    actions = torch.randn(3, 2)
    mean = policy.actor(obs).detach()
    sigma = torch.tensor([1.0, 2.0])
    # log N(a; μ, σ) summed over action dims: −(a − μ)²/(2σ²) − log σ − ½ log 2π
    expected = (-((actions - mean) ** 2) / (2 * sigma**2) - sigma.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_prob, entropy, _ = policy.evaluate(obs, actions)
    torch.testing.assert_close(log_prob.detach(), expected)
    # entropy: Σ (½ + ½ log 2π + log σ) = 2·(½ + ½ log 2π) + log 2
    expected_entropy = 1.0 + math.log(2 * math.pi) + math.log(2.0)
    torch.testing.assert_close(entropy.detach(), torch.full((3,), expected_entropy))
    # the log-std is state-independent and trainable
    assert policy.log_std.requires_grad
    action, _, _ = policy.act(obs, deterministic=True)
    torch.testing.assert_close(action, mean)


def test_cartpole_categorical() -> None:
    torch.manual_seed(2)
    env = gym.make("CartPole-v1")
    policy = build_policy(env.observation_space, env.action_space, hidden=(64, 64))
    env.close()
    assert policy.action_kind == "categorical" and policy.log_std is None
    obs = torch.randn(7, 4)
    action, log_prob, value = policy.act(obs)
    assert action.shape == (7,) and action.dtype == torch.int64 and value.shape == (7,)
    logits = policy.actor(obs).detach()
    torch.testing.assert_close(log_prob, torch.log_softmax(logits, -1).gather(1, action[:, None]).squeeze(1))
    deterministic, _, _ = policy.act(obs, deterministic=True)
    torch.testing.assert_close(deterministic, logits.argmax(-1))


def test_atari_policy_shapes() -> None:
    torch.manual_seed(3)
    policy = build_policy(ATARI_OBS, spaces.Discrete(6))
    convs = [m for m in policy.actor.modules() if isinstance(m, torch.nn.Conv2d)]
    # Table II: 16@8×8 s4 → 32@4×4 s2 → 256@11×11
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (16, (8, 8), (4, 4)),
        (32, (4, 4), (2, 2)),
        (256, (11, 11), (1, 1)),
    ]
    # 84 → 21 → 11 → 1: the last convolution outputs 256×1×1
    trunk = policy.actor[0]
    features = trunk(torch.zeros(1, 3, 84, 84))
    assert features.shape == (1, 256)
    critic_convs = [m for m in policy.critic.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(critic_convs) == 3 and all(c not in convs for c in critic_convs)  # separate trunk
    obs = _obs(ATARI_OBS, 4)
    assert obs.dtype == torch.uint8
    action, log_prob, value = policy.act(obs)
    assert action.shape == (4,) and log_prob.shape == (4,) and value.shape == (4,)
    log_prob2, entropy, _ = policy.evaluate(obs, action)
    torch.testing.assert_close(log_prob2.detach(), log_prob)
    assert (entropy > 0).all() and (entropy <= math.log(6) + 1e-6).all()


def test_atari_input_is_scaled_to_unit_interval() -> None:
    torch.manual_seed(4)
    policy = atari_actor_critic((3, 84, 84), 4)
    frames = torch.randint(0, 256, (2, 3, 84, 84), dtype=torch.uint8)
    expected = policy.critic(frames.float() / 255).squeeze(-1)
    torch.testing.assert_close(policy.value(frames), expected)


def test_discrete_observations_and_unsupported_spaces() -> None:
    policy = build_policy(spaces.Discrete(16), spaces.Discrete(4), hidden=(32,))
    action, _, value = policy.act(torch.tensor([0, 5, 15]))
    assert action.shape == (3,) and value.shape == (3,)
    with pytest.raises(TypeError, match="action space"):
        build_policy(spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([2, 3]))
    with pytest.raises(TypeError, match="Atari"):
        build_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), kind="atari")


def test_critic_gradient_does_not_touch_the_actor() -> None:
    policy = mujoco_actor_critic(5, 2, hidden=(16, 16))
    policy.value(torch.randn(4, 5)).sum().backward()
    assert all(p.grad is None for p in policy.actor.parameters())
    assert all(p.grad is not None for p in policy.critic.parameters())


def test_distributions_support_kl() -> None:
    torch.manual_seed(5)
    for policy, obs in (
        (mujoco_actor_critic(3, 2, hidden=(8,)), torch.randn(4, 3)),
        (build_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(5), hidden=(8,)), torch.randn(4, 3)),
    ):
        other = copy.deepcopy(policy)
        with torch.no_grad():
            for parameter in other.parameters():
                parameter.add_(0.1)
        kl = kl_divergence(policy.distribution(obs), other.distribution(obs))
        assert kl.shape == (4,) and (kl >= -1e-6).all()  # near-equal logits: float32 rounding may dip below 0
        torch.testing.assert_close(kl_divergence(policy.distribution(obs), policy.distribution(obs)), torch.zeros(4))


def test_normaliser_statistics_and_state_dict() -> None:
    torch.manual_seed(6)
    observation_space, action_space = spaces.Box(-np.inf, np.inf, (3,)), spaces.Box(-1, 1, (2,))
    policy = build_policy(observation_space, action_space, hidden=(8,), normalize_obs=True)
    batches = [torch.randn(50, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0]) for _ in range(3)]
    for batch in batches:
        policy.update_obs_normalizer(batch)
    data = torch.cat(batches).double()
    normalizer = policy.obs_normalizer
    assert isinstance(normalizer, RunningNormalizer)
    # the 1e-4 prior count is negligible against 150 samples
    torch.testing.assert_close(normalizer.mean, data.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(normalizer.var, data.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    assert normalizer.count.item() == pytest.approx(150, abs=1e-3)

    state = policy.state_dict()
    assert {"obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count"} <= set(state)
    fresh = build_policy(observation_space, action_space, hidden=(8,), normalize_obs=True)
    fresh.load_state_dict(state)
    obs = torch.randn(4, 3)
    torch.testing.assert_close(fresh.value(obs), policy.value(obs))
    # normalised inputs: ((x − mean)/√var), clipped to ±10
    expected = ((obs.double() - data.mean(0)) / data.var(0, unbiased=False).sqrt()).clamp(-10, 10).float()
    torch.testing.assert_close(normalizer(obs), expected, atol=1e-4, rtol=1e-4)
    assert normalizer(torch.full((1, 3), 1e6)).max().item() == 10.0


def test_normaliser_off_by_default_and_noop_update() -> None:
    policy = build_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), hidden=(8,))
    assert policy.obs_normalizer is None
    policy.update_obs_normalizer(torch.randn(4, 3))
    assert not any("obs_normalizer" in key for key in policy.state_dict())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_act_and_evaluate_agree_over_seeds(seed: int) -> None:
    torch.manual_seed(seed)
    policy = build_policy(spaces.Box(-1, 1, (6,)), spaces.Box(-1, 1, (4,)), hidden=(32, 32), normalize_obs=True)
    obs = torch.randn(16, 6)
    policy.update_obs_normalizer(obs)
    action, log_prob, value = policy.act(obs)
    log_prob2, _, value2 = policy.evaluate(obs, action)
    torch.testing.assert_close(log_prob2.detach(), log_prob)
    torch.testing.assert_close(value2.detach(), value)
    torch.testing.assert_close(policy.distribution(obs).log_prob(action).detach(), log_prob)


SAMPLER_CASES = [  # observation space, action space, normalise observations
    (spaces.Box(-1, 1, (6,)), spaces.Box(-1, 1, (4,)), True),
    (spaces.Box(-1, 1, (5,)), spaces.Discrete(3), False),
    (spaces.Discrete(16), spaces.Discrete(4), False),
    (ATARI_OBS, spaces.Discrete(6), False),
]


@pytest.mark.parametrize(("observation_space", "action_space", "normalize"), SAMPLER_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_sampler_equals_act_for_a_fixed_seed(
    observation_space: spaces.Space, action_space: spaces.Space, normalize: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    policy = build_policy(observation_space, action_space, hidden=(32, 32), normalize_obs=normalize)
    obs = _obs(observation_space, 8, seed)
    if normalize:
        policy.update_obs_normalizer(torch.randn(64, *observation_space.shape) * 3 + 1)
    with torch.no_grad():
        for parameter in policy.parameters():  # away from the init, so σ ≠ 1 and the logits are not flat
            parameter.add_(0.3 * torch.randn_like(parameter))
    sample = policy.sampler()
    torch.manual_seed(100 + seed)
    want = policy.act(obs)
    torch.manual_seed(100 + seed)
    got = sample(obs)
    for a, b in zip(got, want, strict=True):  # the same RNG calls on the same arguments: bit for bit
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    action, log_prob, value = got
    assert action.is_inference()  # outside autograd: fed to envs and stored, never differentiated
    with torch.no_grad():
        torch.testing.assert_close(log_prob, policy.distribution(obs).log_prob(action), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(value, policy.value(obs))
        # V alone (a rollout's last and truncated observations) is the module's, bit for bit
        assert torch.equal(sample.value(obs), policy.value(obs)) and sample.value(obs).is_inference()


def test_sampler_log_prob_by_hand_and_snapshot() -> None:
    torch.manual_seed(7)
    policy = mujoco_actor_critic(4, 2, hidden=(8,))
    assert policy.log_std is not None
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([0.0, math.log(2.0)]))
    sample = policy.sampler()
    obs = torch.randn(64, 4)
    action, log_prob, _ = sample(obs)
    mean, sigma = policy.actor(obs).detach(), torch.tensor([1.0, 2.0])
    expected = (-((action - mean) ** 2) / (2 * sigma**2) - sigma.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(log_prob, expected)
    assert not log_prob.requires_grad
    # σ is a snapshot: a changed policy needs a new sampler, which then agrees with act() again
    with torch.no_grad():
        policy.log_std.add_(1.0)
    torch.manual_seed(8)
    stale = sample(obs)
    torch.manual_seed(8)
    fresh = policy.sampler()(obs)
    torch.manual_seed(8)
    assert torch.equal(fresh[0], policy.act(obs)[0]) and not torch.equal(stale[0], fresh[0])


def test_sampler_draws_from_pi() -> None:
    """Many draws for one observation: Gaussian mean and std per dimension, categorical frequencies."""
    torch.manual_seed(9)
    gaussian = mujoco_actor_critic(3, 2, hidden=(8,))
    obs = torch.randn(1, 3).expand(20000, 3)
    action, _, _ = gaussian.sampler()(obs)
    dist = gaussian.distribution(obs[:1])
    torch.testing.assert_close(action.mean(0), dist.mean[0].detach(), atol=0.03, rtol=0)
    torch.testing.assert_close(action.std(0), dist.stddev[0].detach(), atol=0.03, rtol=0)
    categorical = build_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(4), hidden=(8,))
    with torch.no_grad():
        categorical.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0, 0.5]))
    action, _, _ = categorical.sampler()(obs)
    frequencies = torch.bincount(action, minlength=4) / len(action)
    torch.testing.assert_close(frequencies, categorical.distribution(obs[:1]).probs[0].detach(), atol=0.02, rtol=0)
