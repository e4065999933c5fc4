"""What every peer records, the way the campaign records its own cells (experiments/campaign.py).

A row per iteration (a peer's collect-then-learn, 2048 env steps with the defaults): the env steps so far, the
training clock (seconds since training started, evaluations left out, as the campaign's own cells count only their
rounds), and the mean return of the episodes that ended in the iteration. Every `eval_every` iterations and after the
last, `eval_episodes` episodes of the policy's deterministic action (its mean) on an env of its own, reset with the
run's seed + EVAL_SEED_OFFSET first and unseeded after each episode: stellaris/round/evaluation.py's protocol.

Runs inside the peers' venv: only the standard library, NumPy and Gymnasium are imported.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

PROGRESS_FILE = "progress.csv"
PROGRESS_COLUMNS = ("round", "env_steps", "wall_s", "train_return", "episodes", "eval_return", "eval_episodes")
EVAL_SEED_OFFSET = 1_000_003  # the project's own evaluation offset (stellaris/round/evaluation.py)
EVAL_MAX_EPISODE_STEPS = 10_000  # the project's cap on one evaluation episode (contract/results.py)
PROGRESS_EVERY = 10  # a progress line on stdout every this many iterations

Act = Callable[[np.ndarray], np.ndarray]  # an observation -> the policy's deterministic action


def arguments(description: str, *, budget: str, unit: str, eval_every: int = 41) -> argparse.ArgumentParser:
    """The command line every peer takes: the env, the seed, its budget (`--rounds` or `--steps`, in `unit`), the
    evaluations and the output directory; a peer adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--env", required=True, help="a Gymnasium env id, e.g. Hopper-v5")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument(f"--{budget}", type=int, required=True, help=unit)
    parser.add_argument("--eval-every", type=int, default=eval_every, help="iterations between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def parsed(parser: argparse.ArgumentParser, budget: str) -> argparse.Namespace:
    args = parser.parse_args()
    if getattr(args, budget) < 1:
        parser.error(f"--{budget} must be at least 1, got {getattr(args, budget)}")
    return args


def evaluate(
    env_id: str, act: Act, *, episodes: int, seed: int, max_episode_steps: int = EVAL_MAX_EPISODE_STEPS
) -> list[float]:
    """Returns of `episodes` whole episodes of `act` on a fresh `env_id`, reset with `seed` first and unseeded after
    each episode; actions are clipped to a Box action space. An episode still running after `max_episode_steps` steps
    is ended there."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    env = gym.make(env_id)
    space = env.action_space
    try:
        obs, _ = env.reset(seed=seed)
        returns: list[float] = []
        total, length = 0.0, 0
        while len(returns) < episodes:
            action = act(np.asarray(obs))
            if isinstance(space, gym.spaces.Box):
                action = np.clip(action, space.low, space.high)
            obs, reward, term, trunc, _ = env.step(action)
            total += float(reward)
            length += 1
            if term or trunc or length >= max_episode_steps:
                returns.append(total)
                obs, _ = env.reset()
                total, length = 0.0, 0
        return returns
    finally:
        env.close()


class Recorder:
    """Writes `out/progress.csv` as the run goes: `episode` for each episode that ends, `round_end` after each
    iteration's update (the iterations are numbered from 1; the last is `total_rounds`)."""

    @classmethod
    def of(cls, args: argparse.Namespace, total_rounds: int) -> Recorder:
        """The recorder a peer's parsed command line (`arguments`) asks for."""
        return cls(
            args.out,
            env_id=args.env,
            seed=args.seed,
            total_rounds=total_rounds,
            eval_every=args.eval_every,
            eval_episodes=args.eval_episodes,
        )

    def __init__(
        self,
        out: Path,
        *,
        env_id: str,
        seed: int,
        total_rounds: int,
        eval_every: int,
        eval_episodes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total_rounds < 1 or eval_every < 1 or eval_episodes < 1:
            raise ValueError(
                f"total_rounds, eval_every and eval_episodes must be at least 1, got {total_rounds}, {eval_every}, "
                f"{eval_episodes}"
            )
        self.env_id, self.eval_seed = env_id, seed + EVAL_SEED_OFFSET
        self.total_rounds, self.eval_every, self.eval_episodes = total_rounds, eval_every, eval_episodes
        self.clock = clock
        out.mkdir(parents=True, exist_ok=True)
        self._file = (out / PROGRESS_FILE).open("w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=PROGRESS_COLUMNS)
        self._csv.writeheader()
        self.started, self.eval_s, self.round = clock(), 0.0, 0
        self.return_sum, self.episode_count = 0.0, 0

    def episode(self, episode_return: float) -> None:
        self.episodes(float(episode_return), 1)

    def episodes(self, return_sum: float, count: int) -> None:
        """`count` episodes that ended, their returns summed (a peer that reports sums, as RLlib's callback does)."""
        if count < 0:
            raise ValueError(f"an episode count cannot be negative, got {count}")
        self.return_sum += return_sum
        self.episode_count += count

    def eval_due(self, round_k: int) -> bool:
        return round_k % self.eval_every == 0 or round_k == self.total_rounds

    def round_end(self, env_steps: int, act: Act) -> dict[str, Any]:
        """Close an iteration: its row (evaluated when due) is written and returned."""
        self.round += 1
        row: dict[str, Any] = {
            "round": self.round,
            "env_steps": int(env_steps),
            "wall_s": round(self.clock() - self.started - self.eval_s, 3),
            "train_return": round(self.return_sum / self.episode_count, 2) if self.episode_count else "",
            "episodes": self.episode_count,
            "eval_return": "",
            "eval_episodes": 0,
        }
        if self.eval_due(self.round):
            t0 = self.clock()
            returns = evaluate(self.env_id, act, episodes=self.eval_episodes, seed=self.eval_seed)
            self.eval_s += self.clock() - t0
            row["eval_return"], row["eval_episodes"] = round(float(np.mean(returns)), 2), len(returns)
        self._csv.writerow(row)
        self._file.flush()
        self.return_sum, self.episode_count = 0.0, 0
        if self.round % PROGRESS_EVERY == 0 or row["eval_episodes"]:
            shown = {k: v for k, v in row.items() if v != "" and not (isinstance(v, float) and math.isnan(v))}
            print(" ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
        return row

    def close(self) -> None:
        self._file.close()
