"""What the live view shows beyond the round's row: elapsed time, an ETA against the run's budget, and a line of
history. Pure functions over numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"
HISTORY = 30  # rounds in the history line


def sparkline(values: Sequence[float], width: int = HISTORY) -> str:
    """The last `width` values as block characters scaled between their least and greatest; a NaN (a round in which
    no episode ended) is a space, and equal values sit mid-height."""
    shown = list(values)[-width:]
    finite = [v for v in shown if math.isfinite(v)]
    if not finite:
        return " " * len(shown)
    lo, hi = min(finite), max(finite)
    top = len(BLOCKS) - 1
    out = []
    for v in shown:
        if not math.isfinite(v):
            out.append(" ")
        elif hi == lo:
            out.append(BLOCKS[top // 2])
        else:
            out.append(BLOCKS[min(top, int((v - lo) / (hi - lo) * len(BLOCKS)))])
    return "".join(out)


def eta_s(
    *,
    elapsed_s: float,
    round_k: int,
    env_steps: int,
    rounds: int | None,
    total_steps: int | None,
    max_minutes: float | None,
) -> float | None:
    """Seconds until the first budget runs out, at the pace so far (rounds and steps) or by the clock (minutes);
    None while a pace is unknown and no minutes are given."""
    left: list[float] = []
    if max_minutes is not None:
        left.append(max(0.0, max_minutes * 60 - elapsed_s))
    if rounds is not None and round_k > 0:
        left.append(elapsed_s * max(0, rounds - round_k) / round_k)
    if total_steps is not None and env_steps > 0:
        left.append(elapsed_s * max(0, total_steps - env_steps) / env_steps)
    return min(left) if left else None


def spent_budget(
    *,
    elapsed_s: float,
    round_k: int,
    env_steps: int,
    rounds: int | None,
    total_steps: int | None,
    max_minutes: float | None,
) -> str | None:
    """The first budget the run has used up, named as its option and its value (`rounds: 40`); None while every
    budget given has some left."""
    if rounds is not None and round_k >= rounds:
        return f"rounds: {rounds}"
    if total_steps is not None and env_steps >= total_steps:
        return f"total_steps: {total_steps}"
    if max_minutes is not None and elapsed_s >= max_minutes * 60:
        return f"max_minutes: {max_minutes:g}"
    return None


def clock(seconds: float | None) -> str:
    """h:mm:ss or m:ss; '-' for unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
