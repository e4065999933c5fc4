"""The NumPy PPO gradient against autograd's (``STELLARIS_TORCH_GRADIENT=1``) on the same policy, round and task:
every truncation form, with and without other learners' policies, the normaliser, the clipped value loss, the KL and
entropy terms, the norm clip, Gaussian and categorical heads, tanh and ReLU, packed and named parameters."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from contract.algo_config import PPOConfig
from contract.packed import PACKED
from contract.records import LearnerTask
from functions.algos import ppo_numpy
from functions.algos.algorithm import LearnInputs
from functions.algos.ppo_algo import PPO
from functions.model.flat_params import flatten_parameters
from functions.model.policies import ActorCritic, build_policy

OBS = gym.spaces.Box(-5, 5, (5,))


def _policy(action_space: gym.spaces.Space, *, relu: bool, normalize: bool, seed: int) -> ActorCritic:
    torch.manual_seed(seed)
    activation = "relu" if relu else "tanh"
    policy = build_policy(OBS, action_space, hidden=(16, 8), activation=activation, normalize_obs=normalize)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))  # output layers start near 0: spread the ratios so clips bite
        if policy.obs_normalizer is not None:
            policy.obs_normalizer.update(torch.randn(64, 5) * 3 + 1)
    return policy


def _batch(rng: np.random.Generator, action_space: gym.spaces.Space, steps: int = 32, envs: int = 4) -> dict:
    if isinstance(action_space, gym.spaces.Discrete):
        actions: Any = rng.integers(0, action_space.n, (steps, envs))
    else:
        actions = rng.standard_normal((steps, envs, *action_space.shape)).astype(np.float32)
    done = rng.random((steps, envs)) < 0.05
    return {
        "observations": (rng.standard_normal((steps, envs, 5)) * 2).astype(np.float64),
        "actions": actions,
        "rewards": rng.standard_normal((steps, envs)).astype(np.float32),
        "terminations": done,
        "truncations": np.zeros((steps, envs), bool),
        "behaviour_log_probs": (rng.standard_normal((steps, envs)) * 0.5 - 2).astype(np.float32),
        "values": rng.standard_normal((steps, envs)).astype(np.float32),
        "last_values": rng.standard_normal(envs).astype(np.float32),
        "truncation_values": np.zeros((steps, envs), np.float32),
    }


def _both(
    monkeypatch: pytest.MonkeyPatch,
    cfg: PPOConfig,
    *,
    discrete: bool = False,
    relu: bool = False,
    normalize: bool = True,
    others: int = 2,
    packed: bool = True,
    minibatch: int = 1,
) -> tuple[tuple[dict, dict], tuple[dict, dict]]:
    """(NumPy's gradient and stats, torch's) for one task."""
    space = gym.spaces.Discrete(4) if discrete else gym.spaces.Box(-1, 1, (3,))
    make = lambda seed: _policy(space, relu=relu, normalize=normalize, seed=seed)  # noqa: E731
    policy, proximal, held = make(0), make(1), [make(2 + k) for k in range(others)]
    behaviour = make(9)
    if packed:
        for p in (policy, *held):
            flatten_parameters(p)
    rng = np.random.default_rng(0)
    batches = [_batch(rng, space), _batch(rng, space)]
    for b in batches:  # μ's log-probs of the actions: ratios near 1 with a spread, as a real round has
        steps, envs = b["rewards"].shape
        obs, actions = torch.as_tensor(b["observations"]), torch.as_tensor(b["actions"])
        logp, _, _ = behaviour.evaluate(obs.flatten(0, 1), actions.flatten(0, 1))
        b["behaviour_log_probs"] = logp.detach().reshape(steps, envs).numpy().astype(np.float32)
    data = PPO.with_policy(PPO.prepare(batches, cfg), proximal, cfg)
    task = LearnerTask(round=3, batch_ids=("a", "b"), epoch=1, minibatch=minibatch, num_minibatches=4)
    inputs = LearnInputs(others=held, kl_coef=None, seed=5)
    assert ppo_numpy.plan(policy, held) is not None
    fast = PPO.gradient(policy, data, task, cfg, inputs)
    monkeypatch.setenv("STELLARIS_TORCH_GRADIENT", "1")
    assert ppo_numpy.plan(policy, held) is None
    reference = PPO.gradient(policy, data, task, cfg, inputs)
    monkeypatch.delenv("STELLARIS_TORCH_GRADIENT")
    return fast, reference


def _assert_same(fast: tuple[dict, dict], reference: tuple[dict, dict]) -> None:
    (grads, stats), (ref_grads, ref_stats) = fast, reference
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=2e-4, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert stats.keys() == ref_stats.keys()
    for key, value in ref_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


FORMS = ["surrogate", "weighted", "decoupled"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("truncation", [True, False])
def test_every_truncation_form_matches_autograd(monkeypatch: pytest.MonkeyPatch, form: str, truncation: bool) -> None:
    cfg = PPOConfig(clip=0.2, max_grad_norm=0.5, stellaris={"truncation_form": form, "truncation": truncation})
    fast, reference = _both(monkeypatch, cfg)
    _assert_same(fast, reference)
    assert 0 < reference[1]["clip_fraction"] < 1  # the clip bit on some samples and not on others
    if truncation:
        assert 0 < reference[1]["truncated_fraction"] < 1 and reference[1]["other_policies"] == 2


@pytest.mark.parametrize(
    "options",
    [
        {"vf_clip": 0.2, "kl_coef": 0.3, "ent_coef": 0.01},
        {"normalize_advantages": False, "max_grad_norm": None},
        {"rho": 0.8, "clip": 0.1},
    ],
)
@pytest.mark.parametrize("discrete", [False, True])
def test_loss_terms_and_heads_match_autograd(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], discrete: bool
) -> None:
    rho = options.pop("rho", 1.0)
    cfg = PPOConfig(**options, stellaris={"truncation_form": "surrogate", "rho": rho})
    _assert_same(*_both(monkeypatch, cfg, discrete=discrete))


@pytest.mark.parametrize("packed", [True, False])
def test_relu_unnormalised_and_named_parameters_match_autograd(monkeypatch: pytest.MonkeyPatch, packed: bool) -> None:
    cfg = PPOConfig(vf_clip=0.5, stellaris={"truncation_form": "weighted"})
    fast, reference = _both(monkeypatch, cfg, relu=True, normalize=False, packed=packed, others=1, minibatch=3)
    _assert_same(fast, reference)
    assert (PACKED in fast[0]) is packed


def test_other_architectures_take_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    mlp = _policy(gym.spaces.Discrete(2), relu=False, normalize=False, seed=0)
    assert ppo_numpy.plan(mlp) is not None
    atari = build_policy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(3))
    assert ppo_numpy.plan(atari) is None
    wider = build_policy(OBS, gym.spaces.Discrete(2), hidden=(32,))
    assert ppo_numpy.plan(mlp, [wider]) is None  # another learner's policy of another shape
    narrower = build_policy(OBS, gym.spaces.Discrete(2), hidden=(16, 4))  # the same names, other sizes
    assert ppo_numpy.plan(_policy(gym.spaces.Discrete(2), relu=False, normalize=False, seed=2), [narrower]) is None
    assert ppo_numpy.plan(mlp.double()) is None
    monkeypatch.setenv("STELLARIS_TORCH_GRADIENT", "1")
    assert ppo_numpy.plan(_policy(gym.spaces.Discrete(2), relu=False, normalize=False, seed=1)) is None


SWITCH_VALUES = [("", False), ("0", False), ("No", False), ("true", True), ("1", True)]


@pytest.mark.parametrize(("value", "torch_path"), SWITCH_VALUES)
def test_the_switch_reads_yes_and_no_and_names_anything_else(
    monkeypatch: pytest.MonkeyPatch, value: str, torch_path: bool
) -> None:
    monkeypatch.setenv("STELLARIS_TORCH_GRADIENT", value)
    assert ppo_numpy.torch_gradient() is torch_path
    monkeypatch.setenv("STELLARIS_TORCH_GRADIENT", "sometimes")
    with pytest.raises(ValueError, match="STELLARIS_TORCH_GRADIENT='sometimes'"):
        ppo_numpy.plan(_policy(gym.spaces.Discrete(2), relu=False, normalize=False, seed=1))


def test_weights_loaded_in_place_are_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm instance loads each version's weights into the same policy object: the NumPy views must see them."""
    cfg = PPOConfig(stellaris={"truncation": False})
    space = gym.spaces.Box(-1, 1, (3,))
    policy, newer = (
        _policy(space, relu=False, normalize=True, seed=0),
        _policy(space, relu=False, normalize=True, seed=4),
    )
    flatten_parameters(policy)
    data = PPO.prepare([_batch(np.random.default_rng(1), space)], cfg)
    task = LearnerTask(round=1, batch_ids=("a",), epoch=0, minibatch=0, num_minibatches=2)
    before = PPO.gradient(policy, data, task, cfg, LearnInputs())[0][PACKED].clone()
    policy.load_state_dict(newer.state_dict())
    after = PPO.gradient(policy, data, task, cfg, LearnInputs())[0][PACKED]
    monkeypatch.setenv("STELLARIS_TORCH_GRADIENT", "1")
    torch.testing.assert_close(
        after, PPO.gradient(policy, data, task, cfg, LearnInputs())[0][PACKED], rtol=2e-4, atol=2e-6
    )
    assert not torch.allclose(before, after)
