"""From run directories to numbers: one row per run (runs.csv) and one per suite row over its seeds (summary.csv)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from experiments.suites import RunPlan, baseline_of

BREAKDOWN = {
    # RunResult field -> label (paper Fig. 14); seconds per round, summed over the round's calls
    "actor_s": "actors (waiting for the batch)",
    "learner_compute_s": "learners (gradient compute)",
    "parameter_compute_s": "parameter function (aggregate + step)",
    "invocation_s": "invocation overhead",
    "cache_s": "cache I/O + serialisation",
}
FINAL_SHARE = 0.2  # the final reward is taken over the last 20% of rounds (at least one with episodes)
WINDOW_STEPS = 50_000  # rewards at half the run and at its end: the rounds within this many env steps before
TARGET_ROUNDS = 10  # time to a target reward: when the episode-weighted mean of the last this-many rounds reaches it


def read_info(path: Path, name: str = "info.csv") -> list[dict[str, float]]:
    """A run directory's info.csv (or another CSV of its, `name`) as floats (NaN for blanks)."""
    with (path / name).open(newline="") as f:
        return [{k: float(v) if v not in ("", None) else math.nan for k, v in row.items()} for row in csv.DictReader(f)]


def curve(rows: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(training wall-clock at the end of each round in s, mean episodic reward of the round)."""
    t = np.cumsum([r["duration"] for r in rows])
    return t, np.asarray([r["train_reward_mean"] for r in rows])


def steps_curve(rows: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(env steps sampled by the end of each round, mean episodic reward of the round)."""
    return np.asarray([r["env_steps"] for r in rows]), np.asarray([r["train_reward_mean"] for r in rows])


def final_reward(rows: list[dict[str, float]]) -> float:
    """Episode-weighted mean reward of the rounds in the last FINAL_SHARE of the run that finished episodes."""
    tail = rows[-max(1, math.ceil(len(rows) * FINAL_SHARE)) :]
    with_eps = [r for r in tail if r["episodes"] > 0] or [r for r in rows if r["episodes"] > 0][-1:]
    if not with_eps:
        return math.nan
    weights = np.asarray([r["episodes"] for r in with_eps])
    return float(np.average([r["train_reward_mean"] for r in with_eps], weights=weights))


def final_eval_reward(rows: list[dict[str, float]]) -> float:
    """Mean deterministic-evaluation return of the run's last evaluation (--eval-every; its final policy's when it
    finished); NaN for a run that never evaluated."""
    evaluated = [r for r in rows if r.get("eval_episodes", 0) > 0 and not math.isnan(r["eval_reward_mean"])]
    return evaluated[-1]["eval_reward_mean"] if evaluated else math.nan


def _weighted(rows: list[dict[str, float]]) -> float:
    with_eps = [r for r in rows if r["episodes"] > 0 and not math.isnan(r["train_reward_mean"])]
    if not with_eps:
        return math.nan
    return float(np.average([r["train_reward_mean"] for r in with_eps], weights=[r["episodes"] for r in with_eps]))


def window_reward(rows: list[dict[str, float]], end_steps: float, width: float = WINDOW_STEPS) -> float:
    """Episode-weighted mean reward of the rounds whose cumulative env steps lie in (end − width, end]; NaN when
    the run did not get that far or no episode ended there."""
    if not rows or rows[-1]["env_steps"] < end_steps:
        return math.nan
    return _weighted([r for r in rows if end_steps - width < r["env_steps"] <= end_steps])


def time_to_reward(rows: list[dict[str, float]], target: float, window: int = TARGET_ROUNDS) -> float:
    """Training wall-clock (s) at the end of the first round where the episode-weighted mean reward of the last
    `window` rounds reaches `target`; NaN if it never does."""
    elapsed = 0.0
    for i, r in enumerate(rows):
        elapsed += r["duration"]
        if i + 1 >= window and _weighted(rows[i + 1 - window : i + 1]) >= target:
            return elapsed
    return math.nan


@dataclass
class RunResult:
    run_id: str
    group: str
    variant: str
    seed: int
    rounds: int
    env_steps: int
    final_reward: float
    reward_half: float  # window_reward at half the run's env steps (250k of a 500k run)
    reward_end: float  # window_reward at the run's last round
    time_to_target_s: float  # time_to_reward for the suite's target (NaN without one)
    wall_clock_s: float
    cost_usd: float
    cost_learner_usd: float
    cost_actor_usd: float
    staleness_mean: float
    round_s: float
    actor_s: float
    learner_compute_s: float
    parameter_compute_s: float
    invocation_s: float
    cache_s: float
    overhead_share: float
    eval_reward: float = math.nan  # final_eval_reward: NaN for runs without --eval-every

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _mean(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if not math.isnan(r.get(key, math.nan))]
    return float(np.mean(values)) if values else math.nan


def run_result(plan: RunPlan, path: Path, *, target_reward: float | None = None) -> RunResult | None:
    """The run's numbers, or None when it has not finished a round."""
    if not (path / "info.csv").exists():
        return None
    rows = read_info(path)
    if not rows:
        return None
    state = json.loads((path / "state.json").read_text()) if (path / "state.json").exists() else {}
    # Steady-state rounds for the latency breakdown: round 1 also waits for actors to start.
    steady = rows[1:] or rows
    parts = ("learner_compute_time", "parameter_compute_time", "invocation_overhead", "cache_time")
    functions = sum(_mean(steady, k) for k in parts)
    overhead = _mean(steady, "invocation_overhead") + _mean(steady, "cache_time")
    last = rows[-1]
    return RunResult(
        run_id=plan.run_id,
        group=plan.group,
        variant=plan.variant,
        seed=plan.seed,
        rounds=len(rows),
        env_steps=int(last["env_steps"]),
        final_reward=final_reward(rows),
        reward_half=window_reward(rows, _planned_steps(plan, rows) / 2),
        reward_end=window_reward(rows, last["env_steps"]),
        time_to_target_s=math.nan if target_reward is None else time_to_reward(rows, target_reward),
        wall_clock_s=float(state.get("elapsed_s", sum(r["duration"] for r in rows))),
        cost_usd=last["cost"],
        cost_learner_usd=last.get("cost_learner", math.nan),
        cost_actor_usd=last.get("cost_actor", math.nan),
        staleness_mean=_mean(rows, "staleness_mean"),
        round_s=_mean(steady, "duration"),
        actor_s=_mean(steady, "actor_time"),
        learner_compute_s=_mean(steady, "learner_compute_time"),
        parameter_compute_s=_mean(steady, "parameter_compute_time"),
        invocation_s=_mean(steady, "invocation_overhead"),
        cache_s=_mean(steady, "cache_time"),
        overhead_share=overhead / functions if functions > 0 else math.nan,
        eval_reward=final_eval_reward(rows),
    )


def _planned_steps(plan: RunPlan, rows: list[dict[str, float]]) -> float:
    """The env steps the run is planned for: its rounds times the steps of a round (read from round 1)."""
    return plan.rounds * rows[0]["env_steps"] if "rounds" in plan.config else rows[-1]["env_steps"]


SUMMARY_COLUMNS = [
    "group",
    "variant",
    "seeds",
    "rounds",
    "env_steps",
    "final_reward_mean",
    "final_reward_std",
    "reward_half_mean",
    "reward_half_std",
    "reward_end_mean",
    "reward_end_std",
    "time_to_target_s_mean",
    "wall_clock_s_mean",
    "cost_usd_mean",
    "cost_usd_std",
    "cost_learner_usd_mean",
    "cost_actor_usd_mean",
    "staleness_mean",
    "overhead_share_mean",
    "eval_reward_mean",
    "baseline",
    "reward_ratio",
    "cost_ratio",
    "time_ratio",
]


def _stats(values: list[float]) -> tuple[float, float]:
    """(mean, sample std over seeds; 0 for one seed), ignoring NaN."""
    a = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if a.size == 0:
        return math.nan, math.nan
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def _mean_std(name: str, values: list[float]) -> dict[str, float]:
    mean, std = _stats(values)
    return {f"{name}_mean": mean, f"{name}_std": std}


def _ratio(x: float, base: float) -> float:
    # A ratio against a non-positive reward says nothing (Atari/MuJoCo rewards here are positive in practice).
    return x / base if base > 0 and not math.isnan(x) else math.nan


def summarise(suite: str, results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per (group, variant) in plan order, with mean ± std over seeds and ratios vs the group's baseline."""
    order: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        order.setdefault((r.group, r.variant), []).append(r)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (group, variant), rs in order.items():
        reward, reward_std = _stats([r.final_reward for r in rs])
        cost, cost_std = _stats([r.cost_usd for r in rs])
        rows[group, variant] = {
            "group": group,
            "variant": variant,
            "seeds": len(rs),
            "rounds": max(r.rounds for r in rs),
            "env_steps": max(r.env_steps for r in rs),
            "final_reward_mean": reward,
            "final_reward_std": reward_std,
            **_mean_std("reward_half", [r.reward_half for r in rs]),
            **_mean_std("reward_end", [r.reward_end for r in rs]),
            "time_to_target_s_mean": _stats([r.time_to_target_s for r in rs])[0],
            "wall_clock_s_mean": _stats([r.wall_clock_s for r in rs])[0],
            "cost_usd_mean": cost,
            "cost_usd_std": cost_std,
            "cost_learner_usd_mean": _stats([r.cost_learner_usd for r in rs])[0],
            "cost_actor_usd_mean": _stats([r.cost_actor_usd for r in rs])[0],
            "staleness_mean": _stats([r.staleness_mean for r in rs])[0],
            "overhead_share_mean": _stats([r.overhead_share for r in rs])[0],
            "eval_reward_mean": _stats([r.eval_reward for r in rs])[0],
        }
    for (group, _), row in rows.items():
        base_variant = baseline_of(suite, group)
        base = rows.get((group, base_variant)) if base_variant else None
        row["baseline"] = base_variant if base else ""
        row["reward_ratio"] = _ratio(row["final_reward_mean"], base["final_reward_mean"]) if base else math.nan
        row["cost_ratio"] = _ratio(row["cost_usd_mean"], base["cost_usd_mean"]) if base else math.nan
        row["time_ratio"] = _ratio(row["wall_clock_s_mean"], base["wall_clock_s_mean"]) if base else math.nan
    return list(rows.values())


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def write_outputs(suite_dir: Path, suite: str, results: list[RunResult]) -> list[dict[str, Any]]:
    """runs.csv (a row per run) and summary.csv (a row per suite row over seeds); returns the summary rows."""
    write_csv(suite_dir / "runs.csv", RunResult.columns(), [asdict(r) for r in results])
    summary = summarise(suite, results)
    write_csv(suite_dir / "summary.csv", SUMMARY_COLUMNS, summary)
    return summary
