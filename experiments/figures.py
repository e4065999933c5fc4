"""The paper's figures from a suite's runs (matplotlib, Agg): reward vs wall-clock with seed bands (Fig. 6, 7, 11),
cost bars (Fig. 8), RLlib vs Stellaris (Fig. 9), sensitivity curves (Fig. 13), latency breakdown bars (Fig. 14)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from experiments.suites import ABLATION, SENSITIVITY, SENSITIVITY_DEFAULTS, RunPlan
from experiments.summary import BREAKDOWN, RunResult, curve, read_info, steps_curve

COLORS = {
    "vanilla": "#7f7f7f",
    "stellaris": "#d62728",
    "softsync": "#1f77b4",
    "ssp": "#2ca02c",
    "async": "#ff7f0e",
    "no-truncation": "#9467bd",
    "rllib": "#17becf",
}
GRID_POINTS = 60


def _band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Mean and std over seeds on a common wall-clock grid (up to the shortest run); rounds without a finished
    episode are skipped."""
    clean = [(t[~np.isnan(r)], r[~np.isnan(r)]) for t, r in curves]
    clean = [(t, r) for t, r in clean if t.size]
    if not clean:
        return None
    start, end = max(t[0] for t, _ in clean), min(t[-1] for t, _ in clean)
    if end <= start:
        end = max(t[-1] for t, _ in clean)
    grid = np.linspace(start, end, GRID_POINTS) if end > start else np.asarray([start])
    ys = np.stack([np.interp(grid, t, r) for t, r in clean])
    return grid, ys.mean(axis=0), ys.std(axis=0)


def _reward_panel(
    ax: Any, title: str, series: dict[str, list[tuple[np.ndarray, np.ndarray]]], xlabel: str = "training wall-clock (s)"
) -> None:
    for variant, curves in series.items():
        band = _band(curves)
        if band is None:
            continue
        x, mean, std = band
        color = COLORS.get(variant)
        ax.plot(x, mean, label=f"{variant} (n={len(curves)})", color=color, lw=1.8, marker="." if x.size == 1 else "")
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, lw=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episodic reward")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


Curve = Callable[[list[dict[str, float]]], tuple[np.ndarray, np.ndarray]]


def _curves(
    root: Path, plans: list[RunPlan], groups: list[str], variants: list[str], of: Curve = curve
) -> dict[str, dict[str, list]]:
    """Per group and variant, `of(rows)` (reward vs wall-clock by default) of each run that finished a round."""
    out: dict[str, dict[str, list]] = {g: {v: [] for v in variants} for g in groups}
    for p in plans:
        path = root / "runs" / p.run_id
        if p.group in out and p.variant in out[p.group] and (path / "info.csv").exists():
            rows = read_info(path)
            if rows:
                out[p.group][p.variant].append(of(rows))
    return out


def _grid(n: int) -> tuple[Any, np.ndarray]:
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def _save(fig: Any, path: Path, title: str, note: str, note_share: float = 0.07) -> Path:
    """Title, the note under the panels (in the bottom `note_share` of the figure), saved as PNG."""
    fig.suptitle(title, fontsize=13)
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=8, color="#555555", wrap=True)
    fig.tight_layout(rect=(0, note_share, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reward_figure(
    path: Path, root: Path, plans: list[RunPlan], groups: list[str], variants: list[str], title: str, note: str
) -> Path:
    data = _curves(root, plans, groups, variants)
    fig, axes = _grid(len(groups))
    for ax, group in zip(axes, groups, strict=False):
        _reward_panel(ax, group, data[group])
    return _save(fig, path, title, note)


def cost_figure(path: Path, results: list[RunResult], groups: list[str], note: str) -> Path:
    """Bars per env: vanilla vs Stellaris, learner + parameter cost (hatched) under actor cost, ± std of the total."""
    algos = sorted({g.split("/")[0] for g in groups}, key=["ppo", "impact"].index)
    fig, axes = plt.subplots(1, len(algos), figsize=(7 * len(algos), 4.2), squeeze=False)
    for ax, algo in zip(axes.flat, algos, strict=True):
        envs = [g.split("/")[1] for g in groups if g.startswith(f"{algo}/")]
        for i, variant in enumerate(("vanilla", "stellaris")):
            learner, actor, std = [], [], []
            for env in envs:
                rs = [r for r in results if r.group == f"{algo}/{env}" and r.variant == variant]
                learner.append(np.mean([r.cost_learner_usd for r in rs]) if rs else 0.0)
                actor.append(np.mean([r.cost_actor_usd for r in rs]) if rs else 0.0)
                std.append(np.std([r.cost_usd for r in rs], ddof=1) if len(rs) > 1 else 0.0)
            x = np.arange(len(envs)) + (i - 0.5) * 0.38
            color = COLORS[variant]
            ax.bar(x, learner, 0.36, color=color, alpha=0.45, hatch="//", edgecolor=color, lw=1.0)
            ax.bar(x, actor, 0.36, bottom=learner, color=color, yerr=std, capsize=3, label=variant)
        ax.set_xticks(np.arange(len(envs)), envs)
        ax.set_title(algo.upper())
        ax.set_ylabel("training cost (USD)")
        ax.grid(axis="y", alpha=0.3)
        hatched = Patch(facecolor="white", hatch="//", edgecolor="black", label="learners + parameter (hatched)")
        ax.legend(handles=[*ax.get_legend_handles_labels()[0], hatched], fontsize=8)
    return _save(fig, path, "Training cost: vanilla (serverful) vs Stellaris (serverless)", note)


def sensitivity_figure(path: Path, results: list[RunResult], note: str) -> Path:
    fig, axes = plt.subplots(1, len(SENSITIVITY), figsize=(5 * len(SENSITIVITY), 3.8), squeeze=False)
    labels = {"d": "decay factor d", "v": "learning-rate smoothness v", "rho": "IS truncation threshold ρ"}
    for ax, (name, values) in zip(axes.flat, SENSITIVITY.items(), strict=True):
        rewards, rstd, costs = [], [], []
        for value in values:
            rs = [r for r in results if r.group == name and r.variant == f"{name}={value:g}"]
            finals = [r.final_reward for r in rs if not math.isnan(r.final_reward)]
            rewards.append(np.mean(finals) if finals else np.nan)
            rstd.append(np.std(finals, ddof=1) if len(finals) > 1 else 0.0)
            costs.append(np.mean([r.cost_usd for r in rs]) if rs else np.nan)
        ax.errorbar(values, rewards, yerr=rstd, color=COLORS["stellaris"], marker="o", capsize=3, label="final reward")
        ax.axvline(SENSITIVITY_DEFAULTS[name], color="#aaaaaa", ls=":", lw=1)
        ax.set_xlabel(labels[name])
        ax.set_ylabel("final episodic reward", color=COLORS["stellaris"])
        twin = ax.twinx()
        twin.plot(values, costs, color="#1f77b4", marker="s", ls="--", label="cost")
        twin.set_ylabel("training cost (USD)", color="#1f77b4")
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles, ["final reward", "cost"], fontsize=8, loc="lower right")
    return _save(fig, path, "Sensitivity of Stellaris (PPO, Hopper); dotted line: the default", note)


def breakdown_figure(path: Path, results: list[RunResult], groups: list[str], note: str) -> Path:
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(groups) + 2.6))
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]
    left = np.zeros(len(groups))
    for (attr, label), color in zip(BREAKDOWN.items(), colors, strict=True):
        widths = np.asarray(
            [np.nanmean([getattr(r, attr) for r in results if r.group == g] or [np.nan]) for g in groups]
        )
        widths = np.nan_to_num(widths)
        ax.barh(groups, widths, left=left, color=color, label=label)
        left += widths
    for y, g in enumerate(groups):
        shares = [r.overhead_share for r in results if r.group == g and not math.isnan(r.overhead_share)]
        if shares:
            ax.text(left[y], y, f"  overhead {100 * np.mean(shares):.0f}%", va="center", fontsize=8)
    ax.set_xlabel("seconds per round (function times summed over the round's calls)")
    ax.set_xlim(0, max(float(left.max()), 1e-3) * 1.22)  # room for the overhead labels
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    return _save(fig, path, "Latency breakdown of one Stellaris round (PPO)", note)


def ablation_figure(path: Path, root: Path, plans: list[RunPlan], note: str) -> Path:
    data = _curves(root, plans, ["ppo/Hopper"], list(ABLATION))["ppo/Hopper"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    aggregation = {v: data[v] for v in ("stellaris", "softsync", "ssp", "async")}
    _reward_panel(axes[0, 0], "(a) gradient aggregation", aggregation)
    truncation = {v: data[v] for v in ("stellaris", "no-truncation")}
    _reward_panel(axes[0, 1], "(b) importance-sampling truncation", truncation)
    return _save(fig, path, "Ablation of Stellaris (PPO, Hopper)", note)


def rllib_figure(path: Path, root: Path, plans: list[RunPlan], results: list[RunResult], note: str) -> Path:
    """Per group (env): reward vs env steps and vs training wall-clock, and the cost of each system, learner
    (hatched) under actor cost."""
    groups = list(dict.fromkeys(p.group for p in plans))
    variants = list(dict.fromkeys(p.variant for p in plans))
    by_steps = _curves(root, plans, groups, variants, of=steps_curve)
    by_time = _curves(root, plans, groups, variants)
    fig, axes = plt.subplots(len(groups), 3, figsize=(15, 4.4 * len(groups)), squeeze=False)
    for row, group in zip(axes, groups, strict=True):
        _reward_panel(row[0], f"{group}: reward vs env steps", by_steps[group], "env steps")
        _reward_panel(row[1], f"{group}: reward vs wall-clock", by_time[group])
        ax = row[2]
        for i, variant in enumerate(variants):
            rs = [r for r in results if r.group == group and r.variant == variant]
            if not rs:
                continue
            color = COLORS.get(variant)
            learner = float(np.mean([r.cost_learner_usd for r in rs]))
            actor = float(np.mean([r.cost_actor_usd for r in rs]))
            std = float(np.std([r.cost_usd for r in rs], ddof=1)) if len(rs) > 1 else 0.0
            ax.bar(i, learner, 0.6, color=color, alpha=0.45, hatch="//", edgecolor=color, lw=1.0)
            ax.bar(i, actor, 0.6, bottom=learner, color=color, yerr=std, capsize=3)
        ax.set_xticks(range(len(variants)), variants)
        ax.set_title(f"{group}: training cost")
        ax.set_ylabel("training cost (USD)")
        ax.grid(axis="y", alpha=0.3)
        hatched = Patch(facecolor="white", hatch="//", edgecolor="black", label="learners (hatched)")
        ax.legend(handles=[hatched], fontsize=8)
    cost_note = (
        "RLlib is serverful (docs/experiments.md): its cores at the actor price and its learner at the learner price "
        "for its whole wall-clock, from ray.init; Stellaris as its run reports it."
    )
    title = "RLlib PPO vs Stellaris PPO at equal env steps and cores (cf. paper Fig. 9)"
    return _save(fig, path, title, f"{note}\n{cost_note}", note_share=0.12 / len(groups))
