"""Stable-Baselines3's PPO with its default hyperparameters, measured by the campaign's protocol.

Run from the repository root with the peers' venv interpreter (experiments/peers/venv.py):

    .venv-peers/bin/python -m experiments.peers.sb3_ppo --env Hopper-v5 --seed 1 --rounds 245 --out DIR

`PPO("MlpPolicy", env, seed=seed)` and nothing else set: 2048 steps an iteration, 10 epochs of 64-sample minibatches,
no observation or reward normalization (SB3's defaults, not the RL Zoo's tuned ones). The run is `--rounds`
iterations; `DIR/progress.csv` gets the protocol's rows (experiments/peers/protocol.py).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

from experiments.peers.protocol import Recorder, arguments, parsed

N_STEPS = 2048  # SB3's default rollout length: one iteration


class Protocol(BaseCallback):
    """Feeds the recorder: each episode that ends, and each iteration once its update is done (the next rollout's
    start, or the end of training)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder, self.rollouts = recorder, 0

    def _act(self, obs: np.ndarray) -> np.ndarray:
        action, _ = self.model.predict(obs, deterministic=True)
        return np.asarray(action)

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.recorder.episode(info["episode"]["r"])
        return True

    def _on_rollout_start(self) -> None:
        if self.rollouts:
            self.recorder.round_end(self.num_timesteps, self._act)
        self.rollouts += 1

    def _on_training_end(self) -> None:
        self.recorder.round_end(self.num_timesteps, self._act)


def main() -> None:
    args = parsed(arguments(__doc__.split("\n\n")[0], budget="rounds", unit=f"iterations of {N_STEPS} steps"), "rounds")
    model = PPO("MlpPolicy", gym.make(args.env), seed=args.seed, device="cpu")
    recorder = Recorder.of(args, args.rounds)
    try:
        model.learn(total_timesteps=args.rounds * N_STEPS, callback=Protocol(recorder))
    finally:
        recorder.close()


if __name__ == "__main__":
    main()
