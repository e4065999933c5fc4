"""The algorithm seam: one name table covering every config, the round-boundary actions on the aggregator state,
each algorithm's gradient through the same interface, and observation moments as a field of the gradient record."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from contract import AggregatorState
from contract.algo_config import CONFIGS, APPOConfig, IMPACTConfig, NetworkConfig, PPOConfig
from contract.jobspec import JobSpec
from contract.records import GradientMeta, GradientRecord, LearnerTask, ObsMoments, RecordError
from functions.algos.algorithm import LearnInputs
from functions.algos.registry import ALGORITHMS, algorithm_of
from functions.learner.gradient import gradient_record
from functions.learner.learn import column_weights, obs_moments, sample_weights, time_chunk
from functions.model.policies import build_policy
from functions.runtime.stopwatch import Stopwatch


def test_one_table_row_per_config() -> None:
    assert set(ALGORITHMS) == set(CONFIGS) == {"ppo", "impact", "appo"}
    for name, algo in ALGORITHMS.items():
        assert algo.name == name and algo.config is CONFIGS[name]
        assert algorithm_of(algo.config()) is algo
    assert ALGORITHMS["impact"].uses_target(IMPACTConfig()) and not ALGORITHMS["ppo"].uses_target(PPOConfig())
    assert not ALGORITHMS["appo"].uses_target(APPOConfig()) and ALGORITHMS["appo"].uses_target(APPOConfig(kl_coef=1))


def test_ppo_adapts_kl_coef_at_a_round_boundary() -> None:
    cfg = PPOConfig(kl_coef=0.2, kl_target=0.01)
    state = AggregatorState(round_k=1, kl_sum=0.05, kl_n=1)  # observed 0.05 > 2·target: × 1.5
    after = algorithm_of(cfg).start_round(state, cfg, new_round=2, version=7)
    assert after == state.with_(round_k=2, kl_coef=pytest.approx(0.3), kl_sum=0.0, kl_n=0)
    assert after.target_version is None
    quiet = algorithm_of(cfg).start_round(after.with_(kl_sum=0.001, kl_n=1), cfg, new_round=3, version=9)
    assert quiet.kl_coef == pytest.approx(0.15)  # 0.001 < target/2: × 0.5, from the adapted 0.3
    fixed = PPOConfig(kl_coef=0.0)
    assert algorithm_of(fixed).start_round(state, fixed, new_round=2, version=7).kl_coef is None


@pytest.mark.parametrize("cfg_type", [IMPACTConfig, APPOConfig])
def test_target_network_refreshed_by_update_frequency(cfg_type: type[IMPACTConfig] | type[APPOConfig]) -> None:
    every_second = cfg_type(target_update_frequency=2.0)
    algo = algorithm_of(every_second)
    state = AggregatorState(round_k=1, kl_sum=1.0, kl_n=2)
    state = algo.start_round(state, every_second, new_round=2, version=4)
    assert (state.target_version, state.target_round, state.kl_n) == (4, 2, 0)
    state = algo.start_round(state, every_second, new_round=3, version=6)
    assert (state.target_version, state.target_round) == (4, 2)  # one round since: not yet
    state = algo.start_round(state, every_second, new_round=4, version=8)
    assert (state.target_version, state.target_round, state.round_k) == (8, 4, 4)
    # below 1 means every round (`impact.should_update_target`'s max(1, ·))
    often = cfg_type(target_update_frequency=0.5)
    state = algo.start_round(AggregatorState(round_k=3, target_round=2), often, new_round=4, version=9)
    assert (state.target_version, state.target_round) == (9, 4)


def _batch(rng: np.random.Generator, steps: int, envs: int) -> dict[str, np.ndarray]:
    done = rng.random((steps, envs)) < 0.05
    return {
        "observations": rng.standard_normal((steps, envs, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, (steps, envs)),
        "rewards": np.ones((steps, envs), np.float32),
        "terminations": done,
        "truncations": np.zeros((steps, envs), bool),
        "behaviour_log_probs": np.full((steps, envs), np.log(0.5), np.float32),
        "values": rng.standard_normal((steps, envs)).astype(np.float32),
        "last_values": rng.standard_normal(envs).astype(np.float32),
        "last_observations": rng.standard_normal((envs, 4)).astype(np.float32),
        "truncation_values": np.zeros((steps, envs), np.float32),
    }


@pytest.mark.parametrize("cfg", [PPOConfig(), IMPACTConfig(kl_coef=1.0), APPOConfig(kl_coef=0.5)])
def test_every_algorithm_computes_a_gradient_through_the_seam(cfg: PPOConfig | IMPACTConfig | APPOConfig) -> None:
    torch.manual_seed(0)
    obs_space, act_space = gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2)
    make = lambda: build_policy(obs_space, act_space, hidden=(8,), kind=NetworkConfig().kind)  # noqa: E731
    policy, other, target = make(), make(), make()
    rng = np.random.default_rng(0)
    algo = algorithm_of(cfg)
    data = algo.prepare([_batch(rng, 16, 2), _batch(rng, 16, 3)], cfg)
    task = LearnerTask(round=1, batch_ids=("a", "b"), epoch=0, minibatch=1, num_minibatches=4)
    grads, stats = algo.gradient(policy, data, task, cfg, LearnInputs(others=[other], target=target))
    assert set(grads) == {name for name, _ in policy.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert stats["other_policies"] == 1.0 and 0.0 <= stats["truncated_fraction"] <= 1.0
    assert stats["samples"] == (80 / 4 if cfg.algo == "ppo" else 4 * 5)  # shuffled minibatch, or a time chunk


def test_ppo_decoupled_clip_takes_the_first_policy_of_the_round_as_proximal() -> None:
    torch.manual_seed(0)
    policy = build_policy(gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2), hidden=(8,), kind="mlp")
    rng = np.random.default_rng(0)
    spec_form, decoupled = PPOConfig(), PPOConfig(stellaris={"truncation_form": "decoupled"})
    algo = algorithm_of(decoupled)
    data = algo.prepare([_batch(rng, 16, 2)], decoupled)
    assert algo.with_policy(data, policy, spec_form) is data  # the other forms need nothing of the policy
    completed = algo.with_policy(data, policy, decoupled)
    log_probs, _, _ = policy.evaluate(data.obs, data.actions)
    torch.testing.assert_close(completed.proximal_log_probs, log_probs.detach())
    assert not completed.proximal_log_probs.requires_grad
    # The first task's policy is the proximal one, so nothing is clipped against it yet.
    task = LearnerTask(round=1, batch_ids=("a",), epoch=0, minibatch=0, num_minibatches=2)
    _, stats = algo.gradient(policy, completed, task, decoupled, LearnInputs())
    assert stats["clip_fraction"] == 0.0
    for impact_like in (IMPACTConfig(), APPOConfig()):
        assert algorithm_of(impact_like).with_policy(data, policy, impact_like) is data


def _roundtrip(record: GradientRecord) -> GradientRecord:
    """Through the wire format as a stream entry carries it (field/value pairs, as bytes)."""
    flat = [bytes(x) for x in record.fields()]
    return GradientRecord.from_fields(dict(zip(flat[::2], flat[1::2], strict=True)))


def test_obs_moments_travel_as_a_field_of_the_gradient_record() -> None:
    policy = build_policy(gym.spaces.Box(-5, 5, (3,)), gym.spaces.Discrete(2), hidden=(8,), normalize_obs=True)
    obs = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    moments = obs_moments(policy, [{"observations": obs}])
    assert moments.count == 8.0
    np.testing.assert_allclose(moments.mean.numpy(), obs.reshape(8, 3).mean(0))
    meta = GradientMeta("l1", 3, "1-0", 2, {"loss": 0.5})
    record = GradientRecord(meta, {"w": torch.ones(2)}, moments)
    back = _roundtrip(record)
    assert set(back.tensors) == {"w"} and back.obs_moments is not None and back.obs_moments.count == 8.0
    torch.testing.assert_close(back.obs_moments.var, moments.var)
    plain = GradientRecord(meta, {"w": torch.ones(2)})
    assert (
        GradientRecord.from_fields(dict(zip(plain.fields()[::2], plain.fields()[1::2], strict=True))).obs_moments
        is None
    )
    with pytest.raises(RecordError, match="reserved"):
        GradientRecord(meta, {"obs_moments/mean": torch.ones(2)})


def test_batch_weights_expand_over_each_batchs_env_columns() -> None:
    # batches of 2, 1 and 3 envs side by side (as `time_chunk` concatenates them), weights 1.0, 0.5, 0.25
    w = column_weights([1.0, 0.5, 0.25], [2, 1, 3])
    assert w.tolist() == [1.0, 1.0, 0.5, 0.25, 0.25, 0.25]
    with pytest.raises(ValueError, match="2 batch weights for 3 batches"):
        column_weights([1.0, 0.5], [2, 1, 3])
    rng = np.random.default_rng(0)
    batches = [_batch(rng, 8, 2), _batch(rng, 8, 3)]
    weighted = LearnerTask(
        round=1, batch_ids=("1-0", "r0-0"), epoch=0, minibatch=1, num_minibatches=2, batch_weights=(1.0, 0.5)
    )
    chunk = time_chunk(batches, weighted, gamma=0.99)
    per_sample = sample_weights(weighted, batches, chunk)
    assert per_sample is not None and per_sample.shape == (4, 5) and per_sample.dtype == chunk.rewards.dtype
    assert per_sample.tolist() == [[1.0, 1.0, 0.5, 0.5, 0.5]] * 4  # every step of a batch's envs: its weight
    plain = LearnerTask(round=1, batch_ids=("1-0", "r0-0"), epoch=0, minibatch=1, num_minibatches=2)
    assert sample_weights(plain, batches, chunk) is None  # no weights: the unweighted loss
    ones = LearnerTask(1, ("1-0", "r0-0"), 0, 1, 2, batch_weights=(1.0, 1.0))
    assert sample_weights(ones, batches, chunk) is None


def _replay_gradient(task: LearnerTask, cfg: IMPACTConfig | APPOConfig) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    obs_space, act_space = gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2)
    policy, target = (build_policy(obs_space, act_space, hidden=(8,)) for _ in range(2))
    rng = np.random.default_rng(0)
    data = algorithm_of(cfg).prepare([_batch(rng, 16, 2), _batch(rng, 16, 3)], cfg)
    grads, _ = algorithm_of(cfg).gradient(policy, data, task, cfg, LearnInputs(others=[], target=target))
    return grads


@pytest.mark.parametrize("cfg", [IMPACTConfig(kl_coef=1.0), APPOConfig(kl_coef=1.0)], ids=["impact", "appo"])
def test_replay_algorithms_gradients_take_the_tasks_replay_weights(cfg: IMPACTConfig | APPOConfig) -> None:
    plain = _replay_gradient(LearnerTask(1, ("2-0", "r1-0"), 0, 1, 4), cfg)
    ones = _replay_gradient(LearnerTask(1, ("2-0", "r1-0"), 0, 1, 4, batch_weights=(1.0, 1.0)), cfg)
    weighted = _replay_gradient(LearnerTask(1, ("2-0", "r1-0"), 0, 1, 4, batch_weights=(1.0, 0.5)), cfg)
    assert all(torch.equal(plain[k], ones[k]) for k in plain)
    assert any(not torch.allclose(plain[k], weighted[k]) for k in plain)


def test_the_rounds_last_task_carries_its_obs_moments() -> None:
    """With several epochs the moments come with the last epoch's last minibatch and no other task: every gradient
    of the round before it sees the statistics its batch was collected with."""
    torch.manual_seed(0)
    policy = build_policy(gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2), hidden=(8,), normalize_obs=True)
    cfg = PPOConfig(num_epochs=2, num_minibatches=2, train_batch_size=16)
    spec = JobSpec(job="j", env_id="CartPole-v1", algo=cfg, num_envs=2, actor_steps=8)
    batches = [_batch(np.random.default_rng(2), 8, 2)]
    data = algorithm_of(cfg).prepare(batches, cfg)
    carried = []
    for epoch in range(2):
        for minibatch in range(2):
            record = gradient_record(
                spec,
                policy,
                data,
                batches,
                LearnerTask(1, ("5-0",), epoch, minibatch, 2),
                LearnInputs(others=[]),
                task_id="t",
                learner_id="l",
                base_version=0,
                device="cpu",
                compute=Stopwatch(),
            )
            if record.obs_moments is not None:
                carried.append((epoch, minibatch, record.obs_moments.count))
    assert carried == [(1, 1, 16.0)]


def test_replayed_batches_are_left_out_of_the_obs_moments() -> None:
    """A replayed batch (id r<stream id>) was folded into the normaliser when it was fresh: a round's moments cover
    its fresh batches only, and a round of replayed batches alone sends none. The round's last task carries them, so
    that every gradient of the round sees the statistics its batch was collected with."""
    torch.manual_seed(0)
    policy = build_policy(gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2), hidden=(8,), normalize_obs=True)
    cfg = IMPACTConfig()
    spec = JobSpec(job="j", env_id="CartPole-v1", algo=cfg, num_envs=2, actor_steps=8)
    assert cfg.num_epochs == 1  # the round's last task: epoch 0, minibatch 1 of 2
    rng = np.random.default_rng(1)
    fresh, replayed = _batch(rng, 8, 2), _batch(rng, 8, 3)
    replayed["observations"] = replayed["observations"] + 100.0  # would move the mean visibly if counted

    def moments(ids: tuple[str, ...], batches: list[dict[str, np.ndarray]], minibatch: int = 1) -> ObsMoments | None:
        task = LearnerTask(1, ids, 0, minibatch, 2)
        data = algorithm_of(cfg).prepare(batches, cfg)
        record = gradient_record(
            spec,
            policy,
            data,
            batches,
            task,
            LearnInputs(others=[], target=policy),
            task_id="t",
            learner_id="l",
            base_version=0,
            device="cpu",
            compute=Stopwatch(),
        )
        return record.obs_moments

    got = moments(("5-0", "r3-0"), [fresh, replayed])
    want = obs_moments(policy, [fresh])
    assert got is not None and got.count == 16.0  # 8 steps x 2 envs of the fresh batch; not the 24 replayed
    torch.testing.assert_close(got.mean, want.mean)
    torch.testing.assert_close(got.var, want.var)
    assert moments(("r5-0", "r3-0"), [fresh, replayed]) is None  # replayed batches only: no moments
    assert moments(("5-0", "r3-0"), [fresh, replayed], minibatch=0) is None  # once a round: with its last task
    both = moments(("5-0", "6-0"), [fresh, replayed])  # fresh batches all count
    assert both is not None and both.count == 40.0
