"""Gymnasium env ids as a process resolves them, the same for the functions that make envs (`functions.actor.envs`)
and the control plane that checks a run's env before anything starts (`stellaris.env_check`): importing a user's
`env_module` registers its ids, and a `module:EnvClass` entry point is registered under an id of its own."""

from __future__ import annotations

import importlib
import inspect

import gymnasium as gym


def gym_id(env_id: str, env_module: str | None = None) -> str:
    """The id to give gym.make: imports `env_module` first (it registers its ids); `module:EnvClass` naming a class
    is registered here as `module.EnvClass` (gymnasium itself reads `module:id` as an id the module registers)."""
    if env_module:
        importlib.import_module(env_module)
    if ":" not in env_id:
        return env_id
    module_name, name = env_id.split(":", 1)
    target = getattr(importlib.import_module(module_name), name, None)
    if not (inspect.isclass(target) and issubclass(target, gym.Env)):
        return env_id
    registered = f"{module_name}.{name}"
    if registered not in gym.registry:
        # The ignore: an Env class is an entry point gym.register documents, but gymnasium's EnvCreator protocol
        # (`(**kwargs) -> Env`) does not match the base class's argument-less constructor.
        gym.register(id=registered, entry_point=target)  # type: ignore[arg-type]
    return registered
