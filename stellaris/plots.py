"""Learning curves: a run's curve.png, and `stellaris plot` overlaying runs (same config but seed: mean ± std)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml


class PlotError(ValueError):
    """A run directory that cannot be plotted; the message names it."""


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def run_curve(run: Path) -> dict[str, np.ndarray]:
    """Per round: cumulative env steps, wall-clock seconds and mean training return (rounds with episodes only);
    `eval_*` the same for the rounds with a deterministic evaluation (--eval-every), their mean evaluation return."""
    if not (run / "info.csv").is_file():
        raise PlotError(f"{run} is not a run directory (no info.csv)")
    points: dict[str, list[float]] = {k: [] for k in ("env_steps", "wall_clock_s", "return")}
    points |= {f"eval_{k}": [] for k in points}
    elapsed = 0.0
    for r in _rows(run / "info.csv"):
        elapsed += float(r["duration"] or 0.0)
        for prefix, column in (("", "train_reward_mean"), ("eval_", "eval_reward_mean")):
            mean = float(r.get(column) or "nan")
            if not np.isnan(mean):
                points[f"{prefix}env_steps"].append(float(r["env_steps"] or 0.0))
                points[f"{prefix}wall_clock_s"].append(elapsed)
                points[f"{prefix}return"].append(mean)
    return {k: np.asarray(v) for k, v in points.items()}


def write_curve(run: Path) -> Path:
    """curve.png in `run`: training return (and evaluation return, where the run evaluated) vs env steps and vs
    wall-clock."""
    return plot_runs([run], run / "curve.png")


def _group_key(run: Path) -> str:
    path = run / "config.yaml"
    config: dict[str, Any] = (yaml.safe_load(path.read_text()) or {}).get("config", {}) if path.exists() else {}
    return yaml.safe_dump({k: v for k, v in config.items() if k not in ("seed", "out")}, sort_keys=True)


def plot_runs(runs: list[Path], out: Path) -> Path:
    """Overlay runs' curves; runs whose configs differ only in seed and out are one line, mean ± std over seeds."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        if not (run / "info.csv").is_file():
            raise PlotError(f"{run} is not a run directory (no info.csv)")
        groups.setdefault(_group_key(run), []).append(run)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for members in groups.values():
        curves = [run_curve(r) for r in members]
        label = members[0].name if len(members) == 1 else f"{members[0].name} (+{len(members) - 1} seeds)"
        color = None
        for prefix in ("", "eval_"):  # training return: a line with dots; evaluation return: dashed with squares
            n = min(len(c[f"{prefix}return"]) for c in curves)
            if n == 0:
                continue
            ret = np.stack([c[f"{prefix}return"][:n] for c in curves])
            mean, std = ret.mean(axis=0), ret.std(axis=0)
            for ax, x_key in zip(axes, ("env_steps", "wall_clock_s"), strict=True):
                x = np.stack([c[f"{prefix}{x_key}"][:n] for c in curves]).mean(axis=0)
                style = {"marker": "o", "ms": 3} if not prefix else {"marker": "s", "ms": 4, "linestyle": "--"}
                (line,) = ax.plot(x, mean, color=color, label=label if not prefix else f"{label} (eval)", **style)
                if len(members) > 1:
                    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            color = line.get_color()
    for ax, xlabel in zip(axes, ("env steps", "wall-clock (s)"), strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
