"""Limits of `stellaris train` read from the environment: how long the process waits on what is not its own (a given
gateway, calls stuck at exit). They are not TrainConfig fields, since they bound waits rather than what is trained;
`stellaris train` checks each before a run starts, so a bad value stops it then, naming the variable."""

from __future__ import annotations

import os


def seconds_from_env(name: str, default: float, lo: float, hi: float) -> float:
    """$name as seconds in [lo, hi], or `default` when unset or empty; ValueError naming it otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")  # fails the range check below, with the same message
    if not lo <= seconds <= hi:
        raise ValueError(f"{name} must be a number of seconds from {lo:g} to {hi:g}, got {raw!r}")
    return seconds
