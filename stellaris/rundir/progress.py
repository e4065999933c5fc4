"""What the live view shows beyond the round's row: elapsed time, an ETA against the run's budget, and a line of
history; and which budget a run has spent. Pure functions over numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stellaris.config import TrainConfig

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


@dataclass(frozen=True)
class Standing:
    """Where a run stands against its budgets: its seconds, rounds and env steps so far, and the budgets it was
    given (None: not set)."""

    elapsed_s: float
    round_k: int
    env_steps: int
    rounds: int | None
    total_steps: int | None
    max_minutes: float | None

    @classmethod
    def of(cls, cfg: TrainConfig, *, elapsed_s: float, round_k: int, env_steps: int) -> Standing:
        return cls(elapsed_s, round_k, env_steps, cfg.rounds, cfg.total_steps, cfg.max_minutes)

    def eta_s(self) -> float | None:
        """Seconds until the first budget runs out, at the pace so far (rounds and steps) or by the clock (minutes);
        None while a pace is unknown and no minutes are given."""
        left: list[float] = []
        if self.max_minutes is not None:
            left.append(max(0.0, self.max_minutes * 60 - self.elapsed_s))
        if self.rounds is not None and self.round_k > 0:
            left.append(self.elapsed_s * max(0, self.rounds - self.round_k) / self.round_k)
        if self.total_steps is not None and self.env_steps > 0:
            left.append(self.elapsed_s * max(0, self.total_steps - self.env_steps) / self.env_steps)
        return min(left) if left else None

    def spent(self) -> str | None:
        """The first budget used up, named as its option and its value (`rounds: 40`); None while every budget
        given has some left."""
        if self.rounds is not None and self.round_k >= self.rounds:
            return f"rounds: {self.rounds}"
        if self.total_steps is not None and self.env_steps >= self.total_steps:
            return f"total_steps: {self.total_steps}"
        if self.max_minutes is not None and self.elapsed_s >= self.max_minutes * 60:
            return f"max_minutes: {self.max_minutes:g}"
        return None


def clock(seconds: float | None) -> str:
    """h:mm:ss or m:ss; '-' for unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
