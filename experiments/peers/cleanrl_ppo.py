"""CleanRL's `ppo_continuous_action.py`, run unmodified from a CleanRL checkout, measured by the campaign's protocol.

Run from the repository root with the peers' venv interpreter (experiments/peers/venv.py):

    .venv-peers/bin/python -m experiments.peers.cleanrl_ppo --source CLEANRL --env Hopper-v5 --seed 1 \
        --rounds 245 --out DIR

CLEANRL is a clone of https://github.com/vwxyzjn/cleanrl (the campaign ran commit fe8d8a03); its script runs with
its default hyperparameters, byte for byte. CleanRL targets Gymnasium 0.29; two shims port it to Gymnasium 1.x,
mechanically, without touching its text:
- its vector env resets an ended episode in the same step and reports the episode in `final_info` as a list of
  per-env dicts (Gymnasium 0.29's behaviour; 1.x resets on the next step by default and reports a dict of arrays);
- `TransformObservation` takes the observation space as an optional third argument (1.x requires it).

The protocol hooks CleanRL's own TensorBoard writer: each `charts/episodic_return` is an episode that ended, each
`charts/SPS` (written once per iteration, after the update) ends an iteration. The deterministic evaluation acts with
the policy's mean on observations normalised by the training env's running statistics, clipped to ±10 as CleanRL's
wrappers do.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.utils.tensorboard

from experiments.peers.protocol import Recorder, arguments, parsed
from experiments.peers.venv import CLEANRL_SCRIPT as SCRIPT

NUM_STEPS = 2048  # the script's default rollout length: one iteration
OBS_CLIP = 10.0  # the script clips normalised observations to this


class SameStepSyncVectorEnv(gym.vector.SyncVectorEnv):
    """Gymnasium 0.29's vector env as CleanRL reads it: same-step autoreset, `final_info` a list of per-env dicts."""

    def __init__(self, env_fns: Any, **kwargs: Any) -> None:
        kwargs.setdefault("autoreset_mode", gym.vector.AutoresetMode.SAME_STEP)
        super().__init__(env_fns, **kwargs)

    def step(self, actions: Any) -> Any:
        obs, rewards, terminations, truncations, infos = super().step(actions)
        if "final_info" in infos:
            final, ended = infos["final_info"], infos["_final_info"]
            episode, has_episode = final.get("episode", {}), final.get("_episode", np.zeros(self.num_envs, bool))
            infos["final_info"] = [
                {"episode": {key: values[i] for key, values in episode.items()}}
                if ended[i] and has_episode[i]
                else None
                for i in range(self.num_envs)
            ]
        return obs, rewards, terminations, truncations, infos


class TransformObservation(gym.wrappers.TransformObservation):
    """Gymnasium 1.x's wrapper with the observation space optional again (None keeps the env's)."""

    def __init__(self, env: gym.Env, func: Any, observation_space: gym.Space | None = None) -> None:
        super().__init__(env, func, observation_space)


def _normalizer(envs: gym.vector.SyncVectorEnv) -> gym.wrappers.NormalizeObservation:
    env: Any = envs.envs[0]
    while not isinstance(env, gym.wrappers.NormalizeObservation):
        if not hasattr(env, "env"):
            raise RuntimeError("CleanRL's env has no NormalizeObservation wrapper: the script is not the one expected")
        env = env.env
    return env


def _mean_action(script: dict[str, Any]) -> Any:
    """The deterministic action of the script's agent, on its training env's normalisation (frozen)."""
    agent, norm = script["agent"], _normalizer(script["envs"])

    def act(obs: np.ndarray) -> np.ndarray:
        rms = norm.obs_rms
        scaled = np.clip((obs.reshape(-1) - rms.mean) / np.sqrt(rms.var + norm.epsilon), -OBS_CLIP, OBS_CLIP)
        with torch.no_grad():
            return agent.actor_mean(torch.as_tensor(scaled, dtype=torch.float32).unsqueeze(0))[0].cpu().numpy()

    return act


def _writer(cli: argparse.Namespace) -> type:
    """CleanRL's SummaryWriter, feeding the protocol's recorder as the script logs."""
    base = torch.utils.tensorboard.SummaryWriter

    class ProtocolWriter(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.recorder = Recorder.of(cli, cli.rounds)

        def add_scalar(self, tag: str, value: Any, global_step: Any = None, *args: Any, **kwargs: Any) -> None:
            super().add_scalar(tag, value, global_step, *args, **kwargs)
            if tag == "charts/episodic_return":
                self.recorder.episode(float(value))
            elif tag == "charts/SPS":
                self.recorder.round_end(int(global_step), _mean_action(vars(sys.modules["__main__"])))

        def close(self) -> None:
            super().close()
            self.recorder.close()

    return ProtocolWriter


def main() -> None:
    parser = arguments(__doc__.split("\n\n")[0], budget="rounds", unit=f"iterations of {NUM_STEPS} env steps")
    parser.add_argument("--source", type=Path, required=True, help="a CleanRL clone (or the script itself)")
    args = parsed(parser, "rounds")
    script = (args.source if args.source.is_file() else args.source / SCRIPT).resolve()
    if not script.is_file():
        parser.error(f"--source {args.source}: no {SCRIPT} there; clone https://github.com/vwxyzjn/cleanrl first")
    out = args.out = args.out.resolve()
    print(f"CleanRL script {script} sha256 {hashlib.sha256(script.read_bytes()).hexdigest()[:16]}", flush=True)
    gym.vector.SyncVectorEnv = SameStepSyncVectorEnv  # type: ignore[misc]
    gym.wrappers.TransformObservation = TransformObservation  # type: ignore[misc]
    torch.utils.tensorboard.SummaryWriter = _writer(args)  # type: ignore[misc]
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # the script writes its TensorBoard files under ./runs
    sys.argv = [
        str(script),
        "--env-id",
        args.env,
        "--seed",
        str(args.seed),
        "--total-timesteps",
        str(args.rounds * NUM_STEPS),
    ]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
