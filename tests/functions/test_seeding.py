"""Every source of randomness in round 1 is seeded: an actor's action sampling (its own generator, untouched by
other torch random calls in the process), the learners' minibatch order (the job's seed with round and epoch), and
which batches make round 1 (each actor's first, in actor order)."""

from __future__ import annotations

import numpy as np
import torch

from cache import BatchMeta, LearnerTask
from functions.actor.envs import make_vector_env
from functions.actor.rollout import EpisodeTracker, collect
from functions.learner.learn import minibatch_index
from functions.model.policies import build_policy
from stellaris.round.batches import actor_order, actors_in, first_of_each


def _actions(env_id: str, seed: int, *, noise_between: bool) -> np.ndarray:
    envs = make_vector_env(env_id, 2, seed=3)
    try:
        torch.manual_seed(0)  # the same weights each time: only the sampler's seed varies
        policy = build_policy(envs.single_observation_space, envs.single_action_space, hidden=(8,))
        obs, _ = envs.reset(seed=3)
        generator = torch.Generator().manual_seed(seed)
        if noise_between:
            torch.rand(1000)  # another handler's draws on the global RNG must not move the actor's
        arrays, _ = collect(policy, envs, obs, EpisodeTracker.for_envs(2), 32, generator=generator)
        return arrays["actions"]
    finally:
        envs.close()


def test_an_actors_own_generator_gives_the_same_actions_for_its_seed_whatever_else_draws() -> None:
    for env_id in ("CartPole-v1", "Pendulum-v1"):  # categorical and Gaussian sampling
        first = _actions(env_id, 11, noise_between=False)
        assert np.array_equal(first, _actions(env_id, 11, noise_between=True)), env_id
        assert not np.array_equal(first, _actions(env_id, 12, noise_between=False)), env_id


def test_the_minibatch_order_is_fixed_by_the_jobs_seed_round_and_epoch() -> None:
    task = LearnerTask(round=3, batch_ids=("b",), epoch=1, minibatch=0, num_minibatches=4)
    same = minibatch_index(256, task, seed=5)
    assert torch.equal(same, minibatch_index(256, task, seed=5))
    assert not torch.equal(same, minibatch_index(256, task, seed=6))
    epoch = [minibatch_index(256, LearnerTask(3, ("b",), 1, m, 4), seed=5) for m in range(4)]
    assert sorted(torch.cat(epoch).tolist()) == list(range(256))  # the epoch's minibatches partition the batch


def _landed(batch_id: str, actor: str) -> tuple[str, BatchMeta]:
    return batch_id, BatchMeta(actor_id=actor, behaviour_version=0, env_steps=256, info={})


def test_round_one_is_each_actors_first_batch_in_actor_order() -> None:
    # actor-10 and actor-2 landed two batches each before actor-1 landed its first
    landed = [
        _landed("1-0", "actor-10"),
        _landed("2-0", "actor-2"),
        _landed("3-0", "actor-10"),
        _landed("4-0", "actor-2"),
        _landed("5-0", "actor-1"),
    ]
    chosen, rest = first_of_each(landed)
    assert [b for b, _ in chosen] == ["5-0", "2-0", "1-0"]  # actor-1, actor-2, actor-10
    assert [b for b, _ in rest] == ["3-0", "4-0"]  # the next round's, in arrival order
    assert actors_in(landed) == 3 and actors_in(rest) == 2
    assert sorted(["actor-10", "actor-9", "a"], key=actor_order) == ["a", "actor-9", "actor-10"]
