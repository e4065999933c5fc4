"""The learning rate over a run: constant, or annealed linearly towards 0 over the run's planned rounds as CleanRL's
PPO does (``anneal_lr``: lr·(1 − (k − 1)/N) in round k of N, so the last planned round still steps with lr/N)."""

from __future__ import annotations

from typing import Literal

LrSchedule = Literal["constant", "linear"]


def learning_rate(base: float, schedule: LrSchedule, *, round_k: int, horizon_rounds: int | None) -> float:
    """The rate of round `round_k` (from 1). ``linear`` needs the run's planned rounds; with none known (a run bounded
    by wall-clock time only) it stays at `base`. Rounds past the horizon (a resumed run given more) keep lr/N."""
    if round_k < 1:
        raise ValueError(f"round_k counts from 1, got {round_k}")
    if schedule == "constant" or horizon_rounds is None:
        return base
    if schedule != "linear":
        raise ValueError(f"unknown learning-rate schedule {schedule!r}: choose constant or linear")
    if horizon_rounds < 1:
        raise ValueError(f"horizon_rounds must be at least 1 round, got {horizon_rounds}")
    return base * max(1.0 - (round_k - 1) / horizon_rounds, 1.0 / horizon_rounds)
