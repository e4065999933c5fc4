"""The Python API: ``train(config) -> RunResult`` runs a training job as ``stellaris train`` does, and
``load_policy(run)`` rebuilds its policy from ``policy.safetensors`` alone, with no Redis, gateway or env::

    result = stellaris.train({"env": "CartPole-v1", "rounds": 2})
    policy = stellaris.load_policy(result.run_dir)
    action = policy.act(obs, deterministic=True)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stellaris.policy_file import PolicyFile, PolicyFileError, read_policy_file

if TYPE_CHECKING:
    from gymnasium import spaces

    from functions.model.policies import ActorCritic
    from stellaris.config import TrainConfig

INTERRUPTED = 130  # run_training's exit code after Ctrl-C (SIGINT), as a shell reports it


class TrainingError(RuntimeError):
    """A run that ended without finishing: its exit code (130: interrupted) and its run directory."""

    def __init__(self, message: str, *, exit_code: int, run_dir: Path) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.run_dir = run_dir


@dataclass(frozen=True)
class RunResult:
    """A finished run: where its outputs are, how far it got, and its last info.csv row (numbers typed)."""

    run_dir: Path
    rounds: int
    env_steps: int
    metrics: dict[str, float | int]
    policy_path: Path


def _as_config(config: TrainConfig | Mapping[str, Any] | str | Path) -> TrainConfig:
    """A validated copy (the run fills in `out`; the caller's object stays as given); ConfigError names a bad field."""
    from stellaris.config import TrainConfig, load_config

    if isinstance(config, TrainConfig):
        return config.model_copy(deep=True)
    if isinstance(config, str | Path):
        return load_config(Path(config), {})
    if isinstance(config, Mapping):
        return load_config(None, dict(config))
    raise TypeError(
        f"config must be a TrainConfig, a mapping of its fields or a YAML path, not {type(config).__name__}"
    )


def _number(text: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:  # an empty cell
            return math.nan


def _last_row(info_csv: Path) -> dict[str, float | int]:
    with info_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: _number(v) for k, v in rows[-1].items()} if rows else {}


def train(config: TrainConfig | Mapping[str, Any] | str | Path, *, resume: bool = False) -> RunResult:
    """Train as ``stellaris train`` does, in this process: ``config`` is a TrainConfig, a mapping of its fields or a
    YAML file; ``resume=True`` continues the run in ``config``'s ``out``. Raises ConfigError for a bad config,
    RunDirError for an ``out`` that holds a run already (without ``resume``), TrainingError when the run stops
    without finishing (interrupted: exit code 130), and the platform's own errors (an unreachable Redis, ...)."""
    from stellaris.run import run_training

    cfg = _as_config(config)
    code = run_training(cfg, resume=resume)
    run_dir = cfg.run_dir()
    if code == INTERRUPTED:
        raise TrainingError(
            f"training in {run_dir} was interrupted; continue it with stellaris.train(config, resume=True)",
            exit_code=code,
            run_dir=run_dir,
        )
    if code != 0:
        raise TrainingError(f"training in {run_dir} failed with exit code {code}", exit_code=code, run_dir=run_dir)
    metrics = _last_row(run_dir / "info.csv")
    return RunResult(
        run_dir=run_dir,
        rounds=int(metrics.get("round_id", 0)),
        env_steps=int(metrics.get("env_steps", 0)),
        metrics=metrics,
        policy_path=run_dir / "policy.safetensors",
    )


class Policy:
    """A trained policy rebuilt from its file: ``act`` on one observation or a batch, the observation normaliser
    applied (its statistics are part of the weights). ``network`` is the torch module (functions.model.policies)."""

    def __init__(self, network: ActorCritic, file: PolicyFile) -> None:
        from functions.model.policies import space_from_json

        self.network = network.eval()
        self.observation_space: spaces.Space = space_from_json(file.card["observation_space"])
        self.action_space: spaces.Space = space_from_json(file.card["action_space"])
        self.path, self.env_id, self.algo, self.version = file.path, file.env_id, file.algo, file.version
        self.env_kwargs, self.env_module = file.env_kwargs, file.env_module

    def act(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """The action for one observation (shaped as the observation space), or actions ``[B, ...]`` for a batch
        ``[B, *shape]``; the mode of π(·|s) when deterministic, else a sample. Box actions are clipped to the
        action space, as the actors clip them."""
        import torch
        from gymnasium import spaces

        space = self.observation_space
        x = np.asarray(obs)
        shape = tuple(space.shape or ())
        single = x.shape == shape
        if not single and x.shape[1:] != shape:
            raise ValueError(f"observation of shape {x.shape} is neither one of shape {shape} nor a batch [B, {shape}]")
        dtype = np.int64 if isinstance(space, spaces.Discrete) else space.dtype
        batch = torch.as_tensor(np.asarray(x[None] if single else x, dtype=dtype))
        action, _, _ = self.network.act(batch, deterministic=deterministic)
        actions = action.numpy()
        if isinstance(self.action_space, spaces.Box):
            actions = np.clip(actions, self.action_space.low, self.action_space.high).astype(self.action_space.dtype)
        return actions[0] if single else actions

    def __repr__(self) -> str:
        return f"Policy({self.path}, env {self.env_id}, {self.algo}, version {self.version})"


def load_policy(run_dir_or_file: str | Path) -> Policy:
    """The policy of a run directory (its policy.safetensors) or of the file itself, from that file alone;
    PolicyFileError names what is missing or does not fit."""
    import torch

    from functions.model.policies import policy_from_card

    file = read_policy_file(run_dir_or_file)
    try:
        network = policy_from_card(file.card)
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyFileError(f"{file.path}: its metadata does not describe a network ({exc!r})") from exc
    try:
        network.load_state_dict({k: torch.from_numpy(v) for k, v in file.arrays.items()}, strict=True)
    except RuntimeError as exc:
        raise PolicyFileError(f"{file.path}: its weights do not fit the network its metadata names ({exc})") from exc
    return Policy(network, file)
