"""The peers' protocol, their Gymnasium 1.x shims, and their cells in the campaign, against real envs.

The peers themselves (Stable-Baselines3, CleanRL's script) run in their own venv, outside `make test`
(docs/experiments.md); what runs here is everything of ours they run with.
"""

from __future__ import annotations

import csv
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from experiments import campaign
from experiments.peers import cleanrl_ppo, protocol
from gateway.models import ACTOR_PRICING, LEARNER_PRICING


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / protocol.PROGRESS_FILE).open(newline="") as f:
        return list(csv.DictReader(f))


def test_evaluate_is_deterministic_and_counts_whole_episodes() -> None:
    def act(obs: np.ndarray) -> np.ndarray:
        return np.array([2.0 * obs[2]])  # pushes against the swing: a fixed policy of the observation

    first = protocol.evaluate("Pendulum-v1", act, episodes=3, seed=5)
    assert len(first) == 3 and first == protocol.evaluate("Pendulum-v1", act, episodes=3, seed=5)
    assert first != protocol.evaluate("Pendulum-v1", act, episodes=3, seed=6)
    assert all(-200 * 16.3 <= r <= 0 for r in first)  # Pendulum's 200 steps, each costing at most ~16.27
    # an episode cut at 10 steps returns what those 10 steps earned
    cut = protocol.evaluate("Pendulum-v1", act, episodes=2, seed=5, max_episode_steps=10)
    assert len(cut) == 2 and cut[0] >= first[0]  # the same first 10 steps, without the 190 after
    with pytest.raises(ValueError, match="episodes must be at least 1, got 0"):
        protocol.evaluate("Pendulum-v1", act, episodes=0, seed=5)


def test_recorder_rows_evaluations_and_clock(tmp_path: Path) -> None:
    clock = Clock()
    calls = []

    def act(obs: np.ndarray) -> np.ndarray:
        calls.append(1)
        clock.now += 0.001  # evaluating takes time the training clock must leave out
        return np.zeros(1)

    rec = protocol.Recorder(
        tmp_path, env_id="Pendulum-v1", seed=3, total_rounds=5, eval_every=2, eval_episodes=1, clock=clock
    )
    clock.now += 1.5
    rec.episode(-10.0)
    rec.episode(-20.0)
    first = rec.round_end(2048, act)
    assert first["wall_s"] == 1.5 and first["train_return"] == -15.0 and first["episodes"] == 2
    assert first["eval_episodes"] == 0 and not calls  # round 1: no evaluation due
    clock.now += 2.0
    second = rec.round_end(4096, act)  # round 2 of every 2: evaluated, on one 200-step Pendulum episode
    assert second["train_return"] == "" and second["episodes"] == 0
    assert len(calls) == 200 and second["eval_episodes"] == 1
    assert second["eval_return"] == round(
        protocol.evaluate("Pendulum-v1", lambda o: np.zeros(1), episodes=1, seed=3 + protocol.EVAL_SEED_OFFSET)[0], 2
    )
    assert second["wall_s"] == 3.5
    clock.now += 1.0
    assert rec.round_end(6144, act)["wall_s"] == 4.5  # the 0.2 s of evaluation is not training time
    rec.round_end(8192, act)
    clock.now += 1.0
    last = rec.round_end(10240, act)  # the last round is evaluated whatever eval_every says
    rec.close()
    assert last["eval_episodes"] == 1 and last["round"] == 5
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["eval_episodes"] for r in rows] == ["0", "1", "0", "1", "1"]
    assert list(rows[0]) == list(protocol.PROGRESS_COLUMNS)


def test_recorder_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be at least 1, got 0, 41, 10"):
        protocol.Recorder(tmp_path, env_id="Hopper-v5", seed=1, total_rounds=0, eval_every=41, eval_episodes=10)


def _cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


def test_cleanrl_vector_env_reports_episodes_as_gymnasium_0_29_did() -> None:
    envs = cleanrl_ppo.SameStepSyncVectorEnv([_cartpole, _cartpole])
    envs.reset(seed=1)
    seen, steps = [], 0
    while len(seen) < 3:
        obs, _, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))  # always left: episodes of ~10 steps
        steps += 1
        ended = np.logical_or(term, trunc)
        if "final_info" in infos:
            final = infos["final_info"]
            assert isinstance(final, list) and len(final) == 2
            for i, info in enumerate(final):
                assert (info is not None) == bool(ended[i])
                if info:
                    seen.append(info["episode"])
                    # same-step autoreset: the observation is already the next episode's first
                    assert abs(obs[i]).max() <= 0.05
        else:
            assert not ended.any()
    assert all(int(e["l"]) >= 8 and float(e["r"]) == float(e["l"]) for e in seen)  # CartPole pays 1 a step
    envs.close()


def test_cleanrl_transform_observation_takes_two_arguments() -> None:
    env = cleanrl_ppo.TransformObservation(gym.make("Pendulum-v1"), lambda obs: np.clip(obs, -0.5, 0.5))
    obs, _ = env.reset(seed=0)
    assert env.observation_space == gym.make("Pendulum-v1").observation_space
    assert np.abs(obs).max() <= 0.5


def test_peer_cells_and_commands() -> None:
    cells = campaign.plan_cells("peers")
    assert len(cells) == 3 * (5 + 3 + 3)
    assert {c.mode for c in cells} == {"cleanrl", "sb3", "rllib"} and all(c.preset == "defaults" for c in cells)
    assert [c.id for c in cells[:4]] == [
        "hopper-v5-ppo-cleanrl-s1",
        "hopper-v5-ppo-sb3-s1",
        "hopper-v5-ppo-rllib-s1",
        "walker2d-v5-ppo-cleanrl-s1",
    ]
    assert sorted({c.seed for c in cells if c.env == "Walker2d-v5"}) == [1, 2, 3]
    cmd = cells[0].command(Path("runs/x"))
    assert cmd[1:3] == ["-m", "experiments.peers.cleanrl_ppo"] and "--source" in cmd
    assert cmd[cmd.index("--rounds") + 1] == "245"  # 245 x 2048 = 501,760 steps, as the project's fast preset runs
    assert "--source" not in cells[1].command(Path("runs/y"))
    rllib = cells[2].command(Path("runs/z"))
    assert rllib[rllib.index("--steps") + 1] == "501760" and rllib[rllib.index("--eval-every") + 1] == "21"


def test_peer_rows_are_costed_by_the_cost_model(tmp_path: Path) -> None:
    (tmp_path / protocol.PROGRESS_FILE).write_text(
        "round,env_steps,wall_s,train_return,episodes,eval_return,eval_episodes\n"
        "1,2048,2.5,12.5,40,,0\n"
        "2,4096,5.0,,0,80.25,10\n"
    )
    rows = campaign.peer_rows(tmp_path)
    # a p3.2xlarge's $3.06/h over 4 learner slots plus a c6a.32xlarge's $4.896/h over 128 cores: $0.000223125 a second
    assert LEARNER_PRICING.usd_per_second + ACTOR_PRICING.usd_per_second == pytest.approx(0.000223125)
    assert [r["cost"] for r in rows] == [0.000558, 0.001116]  # 2.5 s and 5 s of it
    assert rows[1]["eval_return"] == "80.25" and rows[0]["staleness_mean"] == ""
