"""Limits of `stellaris train` read from the environment: how long the process waits on what is not its own (a given
gateway, calls stuck at exit) and how often it starts a failing part again (actors, the cache after a loss). They
are not TrainConfig fields, since they bound the process rather than what is trained; a bad value is an error that
names the variable, its range and what it got."""

from __future__ import annotations

import os
from collections.abc import Callable


def _from_env(name: str, default: float, lo: float, hi: float, parse: Callable[[str], float], what: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = float("nan")  # fails the range check below, with the same message
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be {what} from {lo:g} to {hi:g}, got {raw!r}")
    return value


def seconds_from_env(name: str, default: float, lo: float, hi: float) -> float:
    """$name as seconds in [lo, hi], or `default` when unset or empty; ValueError naming it otherwise."""
    return _from_env(name, default, lo, hi, float, "a number of seconds")


def count_from_env(name: str, default: int, lo: int, hi: int) -> int:
    """$name as a whole number in [lo, hi], or `default` when unset or empty; ValueError naming it otherwise."""
    return int(_from_env(name, default, lo, hi, int, "a whole number"))
