"""RLlib's PPO on its new API stack with its default hyperparameters, measured by the campaign's protocol.

Run from the repository root with the peers' venv interpreter (experiments/peers/venv.py):

    .venv-peers/bin/python -m experiments.peers.rllib_ppo --env Hopper-v5 --seed 1 --steps 501760 --out DIR

`PPOConfig().environment(env).debugging(seed=seed)` and nothing else set: RLlib's own batch (4,000 env steps an
iteration), learning rate, epochs, minibatches, network and env runners. Ray gets the machine's cores and a private
temp dir. The run trains until `--steps` env steps are sampled; the protocol evaluates every `--eval-every`
iterations (21 of 4,000 steps: about the 84k of the project's 41 rounds of 2,048) and after the last. The
deterministic action is the mean of RLlib's action distribution, unsquashed to the env's bounds as RLlib's env
runners do.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.columns import Columns

from experiments.peers.protocol import Recorder, arguments, parsed
from experiments.rllib_ppo import EPISODES_KEY, RETURN_SUM_KEY, on_episode_end

BATCH = 4000  # PPOConfig's default train_batch_size_per_learner: one iteration
OBJECT_STORE_BYTES = 200_000_000


def _mean_action(algo: Any) -> Any:
    module = algo.get_module()
    dist_cls = module.get_inference_action_dist_cls()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module.forward_inference({Columns.OBS: torch.as_tensor(obs[None], dtype=torch.float32)})
            action = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS]).to_deterministic().sample()[0].numpy()
        return action

    return act


def _unsquashed(act: Any, low: np.ndarray, high: np.ndarray) -> Any:
    """RLlib's policies act in [-1, 1] (normalize_actions, on by default); its env runners map that onto the env's
    bounds."""

    def env_action(obs: np.ndarray) -> np.ndarray:
        return low + (np.clip(act(obs), -1.0, 1.0) + 1.0) * (high - low) / 2.0

    return env_action


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    args = parsed(arguments(__doc__.split("\n\n")[0], budget="steps", unit="env steps", eval_every=21), "steps")
    signal.signal(signal.SIGTERM, _interrupt)  # stopped by the campaign: ray.shutdown() still runs
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    config = PPOConfig().environment(args.env).callbacks(on_episode_end=on_episode_end).debugging(seed=args.seed)
    temp_dir = tempfile.mkdtemp(prefix="rllib-", dir="/tmp")  # short: Ray's socket paths are capped at 107 bytes
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        algo = config.build_algo()
        space = gym.make(args.env).action_space
        act = _unsquashed(_mean_action(algo), space.low, space.high)
        iterations = math.ceil(args.steps / config.train_batch_size_per_learner)
        recorder = Recorder.of(args, iterations)
        try:
            for _ in range(iterations):
                runners = algo.train().get("env_runners", {})
                # the episodes that ended in this iteration, summed by the callback (RLlib's own mean is smoothed)
                recorder.episodes(
                    float(runners.get(RETURN_SUM_KEY, 0.0) or 0.0), int(runners.get(EPISODES_KEY, 0) or 0)
                )
                recorder.round_end(int(runners.get("num_env_steps_sampled_lifetime", 0)), act)
        finally:
            recorder.close()
        algo.stop()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
