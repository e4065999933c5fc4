"""Checks of a run's environment before anything starts, one field each: env_module imports, env is a known id (or
module:EnvClass) once it has, and env_kwargs is a JSON object that gymnasium.make accepts."""

from __future__ import annotations

import importlib
import json
from typing import Any


def import_env_module(env_module: str | None) -> str | None:
    if env_module:
        try:
            importlib.import_module(env_module)
        except ImportError as exc:
            raise ValueError(f"cannot import env_module {env_module!r} ({exc})") from exc
    return env_module


def known_env(env: str, env_module: str | None) -> str:
    """The id gym.make takes for `env`: importing `env_module` (already checked) may have registered it."""
    import gymnasium as gym

    from host.env_ids import gym_id

    if env.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    try:
        env_id = gym_id(env, env_module)
    except ImportError as exc:
        raise ValueError(f"cannot import the module of env {env!r} ({exc})") from exc
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        hint = f" after importing env_module {env_module!r}" if env_module else ""
        raise ValueError(f"unknown Gymnasium env id {env!r}{hint} ({exc})") from exc
    return env_id


def env_kwargs_object(value: Any) -> Any:
    """The CLI gives JSON text; YAML a mapping. Either must be an object of keyword arguments."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env_kwargs is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"env_kwargs must be a JSON object of gymnasium.make keyword arguments, got {value!r}")
    return value


def make_once(env: str, env_module: str | None, env_kwargs: dict[str, Any]) -> None:
    """Makes the env once with env_kwargs, then closes it, so kwargs its constructor rejects fail here."""
    import gymnasium as gym

    if not env_kwargs or env.startswith("ALE/"):  # ALE kwargs go to AtariVectorEnv, not gym.make
        return
    try:
        gym.make(known_env(env, env_module), **env_kwargs).close()
    except Exception as exc:  # whatever the env's constructor raises on these kwargs
        raise ValueError(f"gymnasium.make({env!r}, **{env_kwargs!r}) rejected them: {exc}") from exc
