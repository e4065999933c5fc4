"""The peers' virtual environment: RLlib, Stable-Baselines3 and CleanRL's dependencies, made on first use.

RLlib 2.60.0 pins `gymnasium==1.2.2`, Stable-Baselines3 2.9.2 wants `gymnasium<1.3`, the project pins 1.4.0: the
peers run in a venv of their own, made the way the RLlib suite's is (experiments/rllib_env.py). MuJoCo is pinned to
the project's version, so that the peers' Hopper is the project's Hopper; `torch` exactly, or pip fetches GBs of CUDA
wheels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from experiments import rllib_env

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-peers"
VENV_ENV_VAR = "STELLARIS_PEERS_VENV"
REQUIREMENTS: tuple[str, ...] = (
    "ray[rllib]==2.60.0",
    "stable-baselines3==2.9.2",
    "torch==2.13.0",
    "gymnasium[mujoco]==1.2.2",  # what RLlib pins, and SB3 admits
    "mujoco==4.0.1",  # the project's
    "numpy==2.4.6",  # the project's
    "tyro==1.0.17",  # CleanRL's command line
    "tensorboard==2.21.0",  # CleanRL's logging
)
CHECK = (
    "import gymnasium, ray, stable_baselines3, torch, tyro; from torch.utils.tensorboard import SummaryWriter; "
    "from ray.rllib.algorithms.ppo import PPOConfig; "
    "gymnasium.make('Hopper-v5').reset(seed=0); print(stable_baselines3.__version__)"
)
CLEANRL_ENV_VAR = "STELLARIS_CLEANRL_SOURCE"
DEFAULT_CLEANRL = REPO_ROOT / ".peers" / "cleanrl"  # a clone of https://github.com/vwxyzjn/cleanrl
CLEANRL_SCRIPT = Path("cleanrl") / "ppo_continuous_action.py"  # in the clone
CLEANRL_COMMIT = "fe8d8a03"  # the commit the campaign's CleanRL cells ran


def venv_path() -> Path:
    """$STELLARIS_PEERS_VENV, else .venv-peers at the repository root."""
    env = os.environ.get(VENV_ENV_VAR)
    return Path(env) if env else DEFAULT_VENV


def cleanrl_source() -> Path:
    """$STELLARIS_CLEANRL_SOURCE, else .peers/cleanrl at the repository root."""
    env = os.environ.get(CLEANRL_ENV_VAR)
    return Path(env) if env else DEFAULT_CLEANRL


def ensure_venv(path: Path | None = None, *, echo: Callable[[str], None] = print) -> Path:
    """The peers' interpreter, making their venv first if it is missing or incomplete."""
    return rllib_env.ensure_venv(
        path or venv_path(),
        echo=echo,
        requirements=REQUIREMENTS,
        check=CHECK,
        what="peers'",
        why="RLlib pins gymnasium 1.2.2 and SB3 wants below 1.3; the project runs 1.4.0",
        pointer=f"${VENV_ENV_VAR}",
    )
