"""The actor's rollout: `collect` against a slow step-by-step reference, the block forms of the episode tracker and
the reward scaler against their per-step forms, the direct sub-env stepping against SyncVectorEnv.step."""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from functions.actor.envs import make_vector_env
from functions.actor.rollout import (
    ClippedRewards,
    EpisodeTracker,
    RewardScaler,
    _env_action,
    _step_each,
    _step_into,
    _stepper,
    collect,
)
from functions.actor.sampler import Sampler
from functions.model.policies import ActorCritic, build_policy


def _tracker_step(tracker: EpisodeTracker, rewards: np.ndarray, done: np.ndarray) -> None:
    """One step, the obvious way: add, count, close finished episodes in env order."""
    tracker.returns += rewards
    tracker.lengths += 1
    for i in np.flatnonzero(done):
        tracker.finished_returns.append(float(tracker.returns[i]))
        tracker.finished_lengths.append(int(tracker.lengths[i]))
        tracker.returns[i] = 0.0
        tracker.lengths[i] = 0


def _scaler_step(scaler: RewardScaler, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
    """One step of the running return-std scaling, the obvious way (CleanRL's NormalizeReward)."""
    scaler.returns = scaler.returns * scaler.gamma + rewards
    n, batch_mean, batch_var = len(scaler.returns), float(scaler.returns.mean()), float(scaler.returns.var())
    delta, total = batch_mean - scaler.mean, scaler.count + n
    scaler.var = (scaler.var * scaler.count + batch_var * n + delta**2 * scaler.count * n / total) / total
    scaler.mean += delta * n / total
    scaler.count = total
    scaler.returns[done] = 0.0
    return np.clip(rewards / np.sqrt(scaler.var + 1e-8), -scaler.clip, scaler.clip)


def _reference_collect(
    policy: ActorCritic,
    envs: gym.vector.VectorEnv,
    obs: np.ndarray,
    tracker: EpisodeTracker,
    steps: int,
    scaler: RewardScaler | None,
    clip_rewards: bool,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`collect` written step by step: `policy.act`, `envs.step`, tracker and scaler per step."""
    out: dict[str, list[Any]] = {k: [] for k in ("obs", "act", "rew", "term", "trunc", "logp", "val", "tval")}
    for _ in range(steps):
        out["obs"].append(obs)
        action, log_prob, value = policy.act(torch.as_tensor(obs))
        obs, reward, term, trunc, info = envs.step(_env_action(action, envs.single_action_space))
        done = np.logical_or(term, trunc)
        _tracker_step(tracker, np.asarray(reward, np.float64), done)
        reward = np.sign(reward) if clip_rewards else np.asarray(reward, np.float64)
        if scaler is not None:
            reward = _scaler_step(scaler, reward, done)
        tval = np.zeros(envs.num_envs, np.float32)
        cut = np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))
        if cut.size:  # V of the true final observations, one batched call
            final = np.stack([info["final_obs"][i] for i in cut]).astype(obs.dtype)
            tval[cut] = policy.value(torch.as_tensor(final)).detach().numpy()
        for key, item in zip(
            ("act", "rew", "term", "trunc", "logp", "val", "tval"),
            (action.numpy(), reward, term, trunc, log_prob.numpy(), value.numpy(), tval),
            strict=True,
        ):
            out[key].append(item)
    # Observations as the MLP's encoder reads them: float64 (MuJoCo's) kept as float32, the rest as they come.
    stored = np.float32 if obs.dtype == np.float64 else obs.dtype
    arrays = {
        "observations": np.stack(out["obs"]).astype(stored),
        "actions": np.stack(out["act"]),
        "rewards": np.stack(out["rew"]).astype(np.float32),
        "terminations": np.stack(out["term"]),
        "truncations": np.stack(out["trunc"]),
        "behaviour_log_probs": np.stack(out["logp"]),
        "values": np.stack(out["val"]),
        "truncation_values": np.stack(out["tval"]),
        "last_observations": obs.astype(stored),
        "last_values": policy.value(torch.as_tensor(obs)).detach().numpy(),
    }
    return arrays, obs


CASES = [  # env, env kwargs, num_envs, steps, reward transform
    ("Hopper-v5", {"max_episode_steps": 25}, 3, 120, "scale"),  # terminations and truncations
    ("CartPole-v1", {"max_episode_steps": 30}, 4, 100, "clip+scale"),  # categorical actions
    ("Pendulum-v1", {}, 2, 50, "none"),  # no episode ends
]


@pytest.mark.parametrize(("env_id", "env_kwargs", "num_envs", "steps", "rewards"), CASES)
def test_collect_matches_the_step_by_step_reference(
    env_id: str, env_kwargs: dict[str, Any], num_envs: int, steps: int, rewards: str
) -> None:
    runs = []
    for fast in (True, False):
        torch.manual_seed(0)
        envs = make_vector_env(env_id, num_envs, seed=3, env_kwargs=env_kwargs)
        policy = build_policy(envs.single_observation_space, envs.single_action_space, hidden=(16,), normalize_obs=True)
        policy.update_obs_normalizer(torch.randn(32, *envs.single_observation_space.shape) * 2 + 1)
        obs, _ = envs.reset(seed=3)
        tracker = EpisodeTracker.for_envs(num_envs)
        scaler = RewardScaler.for_envs(num_envs, 0.99) if "scale" in rewards else None
        transform: RewardScaler | ClippedRewards | None = ClippedRewards(scaler) if "clip" in rewards else scaler
        results = []
        for _ in range(2):  # the tracker's and scaler's state carry over between calls
            if fast:
                arrays, obs = collect(policy, envs, obs, tracker, steps, transform)
            else:
                arrays, obs = _reference_collect(policy, envs, obs, tracker, steps, scaler, "clip" in rewards)
            finished = tracker.take()
            results.append((arrays, finished, tracker.returns.copy(), tracker.lengths.copy()))
        runs.append((results, None if scaler is None else (scaler.mean, scaler.var, scaler.count, scaler.returns)))
        envs.close()
    (fast_results, fast_scaler), (ref_results, ref_scaler) = runs
    for (arrays, finished, returns, lengths), (ref_arrays, ref_finished, ref_returns, ref_lengths) in zip(
        fast_results, ref_results, strict=True
    ):
        assert arrays.keys() == ref_arrays.keys()
        for key, value in arrays.items():
            assert value.dtype == ref_arrays[key].dtype, key
            np.testing.assert_array_equal(value, ref_arrays[key], err_msg=key)
        assert finished == ref_finished
        np.testing.assert_array_equal(returns, ref_returns)
        np.testing.assert_array_equal(lengths, ref_lengths)
    if fast_scaler is not None and ref_scaler is not None:
        assert fast_scaler[:3] == ref_scaler[:3]
        np.testing.assert_array_equal(fast_scaler[3], ref_scaler[3])
    if env_id == "Hopper-v5":
        batches = [r[0] for r in fast_results]
        assert all(b["observations"].dtype == b["last_observations"].dtype == np.float32 for b in batches)
        assert any(b["truncations"].any() and b["truncation_values"].any() for b in batches)
        assert any(b["terminations"].any() for b in batches)


def test_one_batched_policy_call_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    envs = make_vector_env("Hopper-v5", 3, seed=0)
    policy = build_policy(envs.single_observation_space, envs.single_action_space, hidden=(8,))
    batch_sizes: list[int] = []
    make_sampler = policy.sampler

    def counting_sampler(generator: torch.Generator | None = None) -> Sampler:
        sample = make_sampler(generator)

        def call(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            batch_sizes.append(len(obs))
            return sample(obs)

        call.value = sample.value  # type: ignore[attr-defined]  # V of the last and the truncated observations
        return call  # type: ignore[return-value]

    monkeypatch.setattr(policy, "sampler", counting_sampler)
    obs, _ = envs.reset(seed=0)
    collect(policy, envs, obs, EpisodeTracker.for_envs(3), 20)
    assert batch_sizes == [3] * 20


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tracker_block_equals_steps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps, n = 200, 4
    rewards, done = rng.normal(size=(steps, n)) * 10, rng.random((steps, n)) < 0.05
    done[7, :] = True  # all envs at once
    block, stepwise = EpisodeTracker.for_envs(n), EpisodeTracker.for_envs(n)
    for start in (0, 50, 51, 130):  # blocks of varied length, one of a single step
        stop = {0: 50, 50: 51, 51: 130, 130: steps}[start]
        block.step(rewards[start:stop], done[start:stop])
        for t in range(start, stop):
            _tracker_step(stepwise, rewards[t], done[t])
    assert block.finished_returns == stepwise.finished_returns  # same order, same left-to-right sums
    assert block.finished_lengths == stepwise.finished_lengths
    np.testing.assert_array_equal(block.returns, stepwise.returns)
    np.testing.assert_array_equal(block.lengths, stepwise.lengths)
    block.step(rewards[0], done[0])  # a single [N] step still works
    _tracker_step(stepwise, rewards[0], done[0])
    assert block.take() == stepwise.take()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reward_scaler_block_equals_steps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps, n = 300, 3
    rewards, done = rng.normal(size=(steps, n)) * 5 + 1, rng.random((steps, n)) < 0.03
    block, stepwise = RewardScaler.for_envs(n, 0.99), RewardScaler.for_envs(n, 0.99)
    scaled = np.concatenate([block(rewards[:100], done[:100]), block(rewards[100:], done[100:])])
    expected = np.stack([_scaler_step(stepwise, rewards[t], done[t]) for t in range(steps)])
    np.testing.assert_allclose(scaled, expected, rtol=1e-12, atol=0)
    assert block.mean == pytest.approx(stepwise.mean, rel=1e-12)
    assert block.var == pytest.approx(stepwise.var, rel=1e-12)
    assert block.count == stepwise.count
    np.testing.assert_allclose(block.returns, stepwise.returns, rtol=1e-12)
    one = block(rewards[0], done[0])  # a single [N] step keeps its shape
    np.testing.assert_allclose(one, _scaler_step(stepwise, rewards[0], done[0]), rtol=1e-12)
    assert one.shape == (n,)


def test_step_each_equals_sync_vector_env_step() -> None:
    envs, reference = (make_vector_env("Hopper-v5", 2, seed=5, env_kwargs={"max_episode_steps": 15}) for _ in range(2))
    assert isinstance(_stepper(envs), partial)
    obs, _ = envs.reset(seed=5)
    ref_obs, _ = reference.reset(seed=5)
    np.testing.assert_array_equal(obs, ref_obs)
    rng = np.random.default_rng(0)
    ends = 0
    for t in range(80):
        actions = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
        # mix both ways of stepping on one vector env: the direct path leaves it usable
        rows = (np.empty_like(ref_obs), np.empty(2), np.empty(2, bool), np.empty(2, bool))
        got = (*rows, _step_each(envs, actions, *rows)) if t % 3 else envs.step(actions)
        want = reference.step(actions)
        for a, b in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(a, b)
        assert ("final_obs" in got[4]) == ("final_obs" in want[4])
        if "final_obs" in want[4]:
            ends += 1
            for i in range(2):
                if want[4]["final_obs"][i] is None:
                    assert got[4]["final_obs"][i] is None
                else:
                    np.testing.assert_array_equal(got[4]["final_obs"][i], want[4]["final_obs"][i])
    assert ends > 0


def test_other_vector_envs_step_through_their_own_step() -> None:
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
    step = _stepper(envs)
    assert isinstance(step, partial) and step.func is _step_into
    obs, _ = envs.reset(seed=1)
    rows = (np.empty_like(obs), np.empty(1), np.empty(1, bool), np.empty(1, bool))
    assert step(np.array([1]), *rows) == {} and rows[0].shape == obs.shape and not rows[2][0]


def test_refresh_mid_rollout_switches_the_policy_and_each_log_prob_is_its_own() -> None:
    """`refresh` is called every `refresh_every` steps; after it loads new weights, the following steps are taken
    (and their behaviour log-probs and values computed) by the new policy, the earlier ones by the old."""
    envs = make_vector_env("Hopper-v5", 2, seed=5)
    space = (envs.single_observation_space, envs.single_action_space)
    torch.manual_seed(0)
    old, new = build_policy(*space, hidden=(8,)), build_policy(*space, hidden=(8,))
    policy = build_policy(*space, hidden=(8,))
    policy.load_state_dict(old.state_dict())
    calls: list[int] = []

    def refresh() -> bool:
        calls.append(len(calls))
        if len(calls) == 1:  # the first look (step 4) finds a newer policy, the second (step 8) does not
            policy.load_state_dict(new.state_dict())
            return True
        return False

    obs, _ = envs.reset(seed=5)
    arrays, _ = collect(policy, envs, obs, EpisodeTracker.for_envs(2), 12, refresh=refresh, refresh_every=4)
    assert calls == [0, 1]
    steps_obs = torch.as_tensor(arrays["observations"]).reshape(24, -1)
    actions = torch.as_tensor(arrays["actions"]).reshape(24, -1)
    with torch.no_grad():
        by_old, by_new = (p.evaluate(steps_obs, actions)[0].reshape(12, 2).numpy() for p in (old, new))
    logp = arrays["behaviour_log_probs"]
    np.testing.assert_allclose(logp[:4], by_old[:4], atol=1e-5)
    np.testing.assert_allclose(logp[4:], by_new[4:], atol=1e-5)
    assert not np.allclose(logp[4:], by_old[4:], atol=1e-3)  # the two policies differ: the test can fail


def test_a_restored_reward_scaler_scales_as_the_one_it_was_saved_from() -> None:
    """Hand-checked: after 2 steps of returns [1, 3] and [1+0.5·1, 3+0.5·3] = [1.5, 4.5] (γ = 0.5, count 1e-4 at
    start), a scaler restored from the moments scales the next step as the original does once its in-progress
    returns are reset, as a resumed actor's envs are."""
    a = RewardScaler.for_envs(2, 0.5)
    a(np.array([[1.0, 3.0], [1.0, 3.0]]), np.array([[False, False], [False, True]]))
    moments = a.moments()
    # Welford over the batches [1, 3] and [1.5, 4.5] (4 values, the 1e-4 prior weighing next to nothing).
    values = np.array([1.0, 3.0, 1.5, 4.5])
    assert moments[0] == pytest.approx(values.mean(), rel=1e-4) and moments[2] == pytest.approx(4.0001)
    assert moments[1] == pytest.approx(values.var(), rel=1e-3)
    b = RewardScaler.for_envs(2, 0.5)
    b.restore(moments)
    a.returns[:] = 0.0
    step = np.array([2.0, -1.0])
    np.testing.assert_array_equal(b(step, np.array([False, False])), a(step, np.array([False, False])))


@pytest.mark.parametrize("moments", [[0.0, -1.0, 1.0], [0.0, 1.0, 0.0], [float("nan"), 1.0, 1.0]])
def test_impossible_reward_scaler_moments_are_refused(moments: list[float]) -> None:
    with pytest.raises(ValueError, match="reward scaler moments"):
        RewardScaler.for_envs(1, 0.9).restore(moments)
