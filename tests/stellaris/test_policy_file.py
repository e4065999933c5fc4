"""policy.safetensors describes its network: round trips through the real writer (RunDir.write_final_policy, from
a policy frame as the parameter function publishes it) and `stellaris.load_policy`, for Box and Discrete spaces,
images and the observation normaliser, without training; and the clear errors for files that cannot be loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from gymnasium import spaces
from safetensors.torch import save_file

import stellaris
from contract.algo_config import PPOConfig
from contract.codec import decode
from contract.jobspec import JobRequest, resolve
from functions.model.flat_params import flatten_parameters
from functions.model.policies import ActorCritic, build_policy, space_from_json, space_to_json
from functions.model.serialize import policy_to_bytes
from stellaris.evaluate import EvalError, evaluate_run
from stellaris.policy_file import PolicyFileError, read_policy_file
from stellaris.rundir.outputs import RunDir

SPEC = {"env_id": "Pendulum-v1", "algo": {"algo": "impact"}, "seed": 7, "env_kwargs": {"g": 9.0}, "env_module": None}


def write(run_dir: Path, policy: ActorCritic, *, version: int = 5, spec: dict[str, Any] = SPEC) -> Path:
    """What a run leaves: config.yaml with the job spec, and policy.safetensors from the newest policy frame."""
    run = RunDir(run_dir)
    run.write_config({}, spec)
    path = run.write_final_policy(policy_to_bytes(policy, version=version))
    run.close()
    return path


def assert_same_actions(policy: ActorCritic, loaded: stellaris.Policy, obs: np.ndarray) -> None:
    want = policy.act(torch.as_tensor(obs), deterministic=True)[0].numpy()
    space = loaded.action_space
    if isinstance(space, spaces.Box):
        want = np.clip(want, space.low, space.high)
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), want)
    one = loaded.act(obs[0], deterministic=True)  # one observation, no batch (a batch of one computes in float32 too)
    assert one.shape == want[0].shape
    np.testing.assert_allclose(one, want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "per-tensor"])
def test_box_spaces_and_the_observation_normaliser_round_trip(tmp_path: Path, packed: bool) -> None:
    """The parameter function publishes packed policies (one array of parameters): the file names each one."""
    obs_space = spaces.Box(np.array([-1, -2, -np.inf], np.float32), np.array([1, 2, np.inf], np.float32))
    act_space = spaces.Box(-0.5, 0.5, (2,), np.float32)
    policy = build_policy(obs_space, act_space, hidden=(16, 8), activation="relu", normalize_obs=True)
    if packed:
        flatten_parameters(policy)
    torch.manual_seed(0)
    policy.update_obs_normalizer(torch.randn(256, 3) * 4 + 3)  # statistics far from the initial (0, 1)
    with torch.no_grad():
        policy.actor[-1].weight.mul_(300)  # actions past the bounds, so clipping shows
    loaded = stellaris.load_policy(write(tmp_path / "run", policy).parent)  # a run directory
    stored = read_policy_file(tmp_path / "run").arrays
    assert {k: v.shape for k, v in stored.items()} == {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    assert loaded.observation_space == obs_space and loaded.action_space == act_space
    assert loaded.network.obs_normalizer is not None and policy.obs_normalizer is not None
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(loaded.network.obs_normalizer, name), getattr(policy.obs_normalizer, name))
    obs = np.random.default_rng(1).normal(3, 4, size=(32, 3)).astype(np.float32)
    assert_same_actions(policy, loaded, obs)
    assert np.abs(loaded.act(obs)).max() == pytest.approx(0.5)  # clipped to the action space
    sampled = loaded.act(obs, deterministic=False)
    assert sampled.shape == (32, 2) and sampled.dtype == np.float32


def test_discrete_spaces_round_trip(tmp_path: Path) -> None:
    obs_space, act_space = spaces.Discrete(7, start=1), spaces.Discrete(3)
    policy = build_policy(obs_space, act_space, hidden=(8,))
    with torch.no_grad():
        policy.actor[-1].weight.normal_(0, 5)  # distinct argmaxes across observations
    loaded = stellaris.load_policy(write(tmp_path / "run", policy))  # the file itself
    assert loaded.observation_space == obs_space and loaded.action_space == act_space
    obs = np.arange(7)
    assert_same_actions(policy, loaded, obs)
    assert len(set(loaded.act(obs).tolist())) > 1


def test_image_observations_keep_the_atari_network_and_a_short_description(tmp_path: Path) -> None:
    obs_space, act_space = spaces.Box(0, 255, (3, 84, 84), np.uint8), spaces.Discrete(6)
    policy = build_policy(obs_space, act_space)  # auto: the Atari conv net
    path = write(tmp_path / "run", policy)
    file = read_policy_file(path)
    assert file.card["observation_space"] == {
        "type": "Box",
        "shape": [3, 84, 84],
        "dtype": "uint8",
        "low": 0,
        "high": 255,
    }
    loaded = stellaris.load_policy(path)
    assert loaded.network.card == policy.card
    obs = np.random.default_rng(2).integers(0, 256, size=(4, 3, 84, 84), dtype=np.uint8)
    assert_same_actions(policy, loaded, obs)


def test_the_metadata_names_the_env_algorithm_and_versions(tmp_path: Path) -> None:
    policy = build_policy(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (1,), np.float32), hidden=(4,))
    loaded = stellaris.load_policy(write(tmp_path / "run", policy, version=42))
    assert (loaded.env_id, loaded.algo, loaded.version) == ("Pendulum-v1", "impact", 42)
    assert (loaded.env_kwargs, loaded.env_module) == ({"g": 9.0}, None)
    meta = read_policy_file(tmp_path / "run").metadata
    assert meta["format"] == "stellaris-policy/1" and meta["seed"] == "7" and meta["stellaris"]
    assert json.loads(meta["network"]) == {"kind": "auto", "hidden": [4], "activation": "tanh", "normalize_obs": False}


def test_every_policy_frame_carries_its_card() -> None:
    """The parameter function's frames (and so every checkpoint) describe their network, so the control plane can
    write a portable file without knowing the spaces."""
    policy = build_policy(spaces.Discrete(4), spaces.Discrete(2), hidden=(4,))
    assert decode(policy_to_bytes(policy, version=3)).meta == {"kind": "policy", "version": 3, "card": policy.card}


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
        spaces.Box(np.array([0, -1]), np.array([5, 1]), dtype=np.int64),
        spaces.Discrete(9, start=-4),
    ],
)
def test_spaces_survive_json(space: spaces.Space) -> None:
    assert space_from_json(json.loads(json.dumps(space_to_json(space), allow_nan=False))) == space


def test_a_file_without_a_description_gets_an_error_naming_what_it_lacks(tmp_path: Path) -> None:
    """A policy.safetensors from before files described their network: weights only."""
    policy = build_policy(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), hidden=(4,))
    old = tmp_path / "policy.safetensors"
    save_file(dict(policy.state_dict()), str(old), metadata={"version": "3"})
    with pytest.raises(PolicyFileError, match="lacks network, observation_space, action_space, env_id, algo"):
        stellaris.load_policy(old)


def test_unloadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="does not exist"):
        stellaris.load_policy(tmp_path / "nowhere")
    with pytest.raises(PolicyFileError, match=r"empty/policy.safetensors does not exist"):
        stellaris.load_policy((tmp_path / "empty").mkdir() or tmp_path / "empty")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(PolicyFileError, match="is not a safetensors file"):
        stellaris.load_policy(junk)


def test_weights_that_do_not_fit_the_description_and_misshapen_observations(tmp_path: Path) -> None:
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    path = write(tmp_path / "run", build_policy(obs_space, act_space, hidden=(4,)))
    other = build_policy(obs_space, act_space, hidden=(5,))
    meta = read_policy_file(path).metadata
    save_file(dict(other.state_dict()), str(path), metadata=meta)
    with pytest.raises(PolicyFileError, match="weights do not fit"):
        stellaris.load_policy(path)
    good = stellaris.load_policy(write(tmp_path / "good", build_policy(obs_space, act_space, hidden=(4,))))
    with pytest.raises(ValueError, match=r"shape \(5,\) is neither one of shape \(3,\)"):
        good.act(np.zeros(5, dtype=np.float32))


def test_stellaris_eval_names_a_file_from_before_policies_described_themselves(tmp_path: Path) -> None:
    """`stellaris eval` loads through load_policy: an old file is an EvalError (one line at the CLI), not a KeyError."""
    spec = resolve(JobRequest(job="j", env_id="CartPole-v1", algo=PPOConfig())).model_dump(mode="json")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"config": {}, "job_spec": spec}))
    policy = build_policy(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    save_file(dict(policy.state_dict()), str(tmp_path / "policy.safetensors"))
    with pytest.raises(EvalError, match=r"policy\.safetensors lacks network"):
        evaluate_run(tmp_path, episodes=1, seed=0)
