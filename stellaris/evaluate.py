"""`stellaris eval RUN_DIR`: the run's final policy on fresh episodes, deterministic actions."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from contract.jobspec import JobSpec
from stellaris.api import load_policy
from stellaris.policy_file import PolicyFileError
from stellaris.round.evaluation import EVAL_SEED_OFFSET


class EvalError(ValueError):
    """A directory that holds no finished policy to evaluate; the message names it."""


def _job_spec(run_dir: Path) -> JobSpec:
    if not run_dir.exists():
        raise EvalError(f"{run_dir} does not exist (give a run directory, e.g. runs/CartPole-v1-stellaris-...)")
    if not run_dir.is_dir():
        raise EvalError(f"{run_dir} is not a directory (give a run directory, e.g. runs/CartPole-v1-stellaris-...)")
    for name in ("config.yaml", "policy.safetensors"):
        if not (run_dir / name).is_file():
            raise EvalError(f"{run_dir} has no {name}: not a run directory, or its run finished no round")
    try:
        return JobSpec.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text())["job_spec"])
    except (yaml.YAMLError, ValidationError, KeyError, TypeError) as exc:
        raise EvalError(f"{run_dir / 'config.yaml'} is not a run's config (no valid job_spec)") from exc


def evaluate_run(run_dir: Path, *, episodes: int, seed: int | None = None) -> list[float]:
    """Deterministic episodes of the run's final policy. The default seed is the run's evaluation env's (its seed +
    EVAL_SEED_OFFSET), so that a run's last `eval_reward_*` row is played again exactly."""
    # The envs and the network (torch) load here, not at import: every command's error handling imports EvalError.
    from functions.actor.envs import make_vector_env
    from functions.actor.evaluation import run_episodes

    spec = _job_spec(run_dir)
    seed = spec.seed + EVAL_SEED_OFFSET if seed is None else seed
    env = make_vector_env(spec.env_id, 1, seed=seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module)
    try:
        policy = load_policy(run_dir).network  # rebuilt from policy.safetensors alone, as users load it
    except PolicyFileError as exc:
        raise EvalError(str(exc)) from exc
    try:
        return run_episodes(policy, env, episodes=episodes, seed=seed).returns
    finally:
        env.close()
