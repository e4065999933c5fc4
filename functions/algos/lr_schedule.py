"""The learning rate over a run: constant; annealed linearly towards 0 over the run's planned rounds as CleanRL's
PPO does (``anneal_lr``: lr·(1 − (k − 1)/N) in round k of N, so the last planned round still steps with lr/N); or
decayed exponentially, lr·f^((k − 1)/N), from lr in the first round towards lr·f at the horizon (f: the final
fraction)."""

from __future__ import annotations

from typing import get_args

from contract.algo_config import FINAL_FRACTION, LrSchedule


def learning_rate(
    base: float,
    schedule: LrSchedule,
    *,
    round_k: int,
    horizon_rounds: int | None,
    final_fraction: float = FINAL_FRACTION,
) -> float:
    """The rate of round `round_k` (from 1). ``linear`` and ``exponential`` need the run's planned rounds (the job's
    `Plan`, ≥ 1); with none known (a run bounded by wall-clock time only) they stay at `base`. Rounds past the
    horizon (a resumed run given more) keep the horizon's last rate. The final fraction's bounds are the config's
    (`lr_final_fraction`, contract.algo_config)."""
    if round_k < 1:
        raise ValueError(f"round_k counts from 1, got {round_k}")
    if schedule not in get_args(LrSchedule):
        names = ", ".join(get_args(LrSchedule))
        raise ValueError(f"unknown learning-rate schedule {schedule!r}: choose one of {names}")
    if schedule == "constant" or horizon_rounds is None:
        return base
    k = min(round_k, horizon_rounds)
    if schedule == "linear":
        return base * (1.0 - (k - 1) / horizon_rounds)
    return base * final_fraction ** ((k - 1) / horizon_rounds)
