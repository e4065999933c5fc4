"""The scale model's outputs (docs/scale-model.md#outputs): one row per modelled round, named as `info.csv` names the
same quantity (docs/training.md#the-run-directory), a summary per N, and the round-by-round comparison with a real
run's `info.csv` (the validation at N = 1). Pure: rows in, CSV text and numbers out."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from stellaris.rundir.outputs import atomic_write


@dataclass(frozen=True)
class RoundRow:
    """One modelled round. Seconds are virtual (the model's clock), costs in dollars and cumulative, as info.csv's;
    `learner_compute_time` and `parameter_compute_time` are what this machine measured for the round's gradients and
    applies."""

    round_id: int
    learners: int
    env_steps: int  # so far in the run
    wall_clock_s: float  # from launch to the round's end
    duration: float  # the round: collection, then learning
    actor_time: float  # the round's collection
    learn_time: float  # from the batch landing to the round's last publish
    cost: float
    cost_learner: float
    cost_actor: float
    train_reward_mean: float  # the training episodes that ended in the round (NaN: none did)
    episodes: int
    eval_reward_mean: float  # NaN: no evaluation this round
    eval_episodes: int
    staleness_mean: float  # of the gradients applied in the round
    staleness_max: float
    gradients_applied: int
    aggregations: int
    flushes: int
    cold_starts: int
    learner_compute_time: float
    parameter_compute_time: float


COLUMNS = [f.name for f in fields(RoundRow)]


@dataclass(frozen=True)
class Summary:
    """One modelled run, as the plan's table shows it: N, modelled wall-clock and cost to finish, the last round's
    training (and evaluation) return, the mean staleness over every applied gradient, the gradients applied."""

    learners: int
    rounds: int
    env_steps: int
    wall_clock_s: float
    cost: float
    final_return: float
    eval_return: float
    staleness_mean: float
    gradients_applied: int
    flushes: int


SUMMARY_COLUMNS = [f.name for f in fields(Summary)]


def summarize(rows: Sequence[RoundRow]) -> Summary:
    if not rows:
        raise ValueError("no rounds to summarize")
    last = rows[-1]
    applied = sum(r.gradients_applied for r in rows)
    weighted = sum(r.staleness_mean * r.gradients_applied for r in rows if r.gradients_applied)
    evaluated = [r.eval_reward_mean for r in rows if r.eval_episodes]
    return Summary(
        learners=last.learners,
        rounds=len(rows),
        env_steps=last.env_steps,
        wall_clock_s=last.wall_clock_s,
        cost=last.cost,
        final_return=last.train_reward_mean,
        eval_return=evaluated[-1] if evaluated else math.nan,
        staleness_mean=weighted / applied if applied else math.nan,
        gradients_applied=applied,
        flushes=sum(r.flushes for r in rows),
    )


def csv_text(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def write_rows(path: Path, rows: Sequence[RoundRow]) -> Path:
    atomic_write(path, csv_text(COLUMNS, (asdict(r) for r in rows)).encode())
    return path


def write_summaries(path: Path, summaries: Sequence[Summary]) -> Path:
    atomic_write(path, csv_text(SUMMARY_COLUMNS, (asdict(s) for s in summaries)).encode())
    return path


def rows_file(out: Path, learners: int) -> Path:
    return out / f"learners-{learners}.csv"


# --- the validation: a real run's info.csv against the model ---------------------------------------------------

# (info.csv's column, the model's): the quantities compared round by round. info.csv's duration and cost include
# what the model leaves out (the platform's start, cache I/O, the network): docs/scale-model.md#validation.
COMPARED = (
    ("train_reward_mean", "train_reward_mean"),
    ("staleness_mean", "staleness_mean"),
    ("gradients_applied", "gradients_applied"),
    ("aggregations", "aggregations"),
    ("duration", "duration"),
    ("cost", "cost"),
)
COMPARE_COLUMNS = ["round_id", *(f"{side}_{name}" for name, _ in COMPARED for side in ("real", "model"))]


def read_info(path: Path) -> list[dict[str, str]]:
    """A run's info.csv rows; ValueError naming the file when it has none to compare."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not rows or "round_id" not in rows[0]:
        raise ValueError(f"{path} has no rounds to compare (not a run's info.csv, or its run finished no round)")
    return rows


def number(text: str | None) -> float:
    """An info.csv cell as a float (NaN when blank or not a number)."""
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def compare_rows(info: Sequence[dict[str, str]], rows: Sequence[RoundRow]) -> list[dict[str, float | int]]:
    """Round by round, over the rounds both have: each compared quantity, real and modelled."""
    model = {r.round_id: asdict(r) for r in rows}
    out: list[dict[str, float | int]] = []
    for real in info:
        round_id = int(number(real.get("round_id")))
        if round_id not in model:
            continue
        row: dict[str, float | int] = {"round_id": round_id}
        for real_name, model_name in COMPARED:
            row[f"real_{real_name}"] = number(real.get(real_name))
            row[f"model_{real_name}"] = float(model[round_id][model_name])
        out.append(row)
    return out


def write_comparison(path: Path, compared: Sequence[dict[str, float | int]]) -> Path:
    atomic_write(path, csv_text(COMPARE_COLUMNS, compared).encode())
    return path
