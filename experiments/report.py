"""`python -m experiments.report`: the results page of the evaluation campaign, rebuilt from its committed CSVs.

Reads `results/campaign/<plan>/` (`cells.csv` and one CSV per cell, experiments/campaign.py) and writes
`docs/results/evaluation.md` with its figures beside it: per env, the IQM of the deterministic evaluation return at
250k and 500k env steps with stratified-bootstrap 95 % intervals over seeds (experiments/stats.py), the training
return in the 50k steps before each, wall-clock to fixed returns and the cost; reward against env steps and against
wall-clock with interval bands, cost bars and performance profiles; and the goals, each met or missed with its
figures. The same CSVs always give the same page (the bootstrap is seeded).
"""

from __future__ import annotations

import csv
import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import typer

from experiments import campaign, stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PAGE = Path("docs/results/evaluation.md")
TITLE = "Evaluation: Stellaris against the modes"
CHECKPOINTS = (250_000, 500_000)
WINDOW = 50_000  # the training return at a checkpoint: episodes of the rounds in the 50k steps before it
TARGETS: dict[str, tuple[float, float]] = {  # wall-clock to these training returns (Hopper's from the issue)
    "Hopper-v5": (1500.0, 2500.0),
    "Walker2d-v5": (1500.0, 3000.0),
    "HalfCheetah-v5": (1500.0, 3000.0),
}
TARGET_ROUNDS = 5  # a target is reached when the episode-weighted mean of the last 5 rounds' returns gets there
GRID_POINTS = 26  # the curves' common grid, per env
BAND_REPS = 1000  # bootstrap replications of a curve's band and a profile (the tables use stats.REPS)
MIN_SEEDS = 5  # a goal is met or missed on at least this many seeds a side
SCALE_GOAL_LEARNERS = 4  # the scale model's goals hold at N >= 4
PEERS = ("cleanrl", "sb3", "rllib")  # other libraries' PPO (experiments/peers/)
MODE_ORDER = ("stellaris", "sync", "async", "softsync", "ssp", *PEERS)
RESULTS = (Path("results/campaign/modes"), Path("results/campaign/peers"))


@dataclass(frozen=True)
class Run:
    cell: str
    env: str
    mode: str
    seed: int
    run_s: float
    rows: list[dict[str, float]]
    learners: int = 0  # a scale-model run's N (0: a real run)

    @property
    def group(self) -> str:
        """What the page groups it under: its env, and N for a modelled run."""
        return f"{self.env}, N = {self.learners}" if self.learners else self.env


def base_env(group: str) -> str:
    return group.split(",")[0]


def _float(v: str) -> float:
    return float(v) if v not in ("", None) else math.nan


def load(results: Path | Sequence[Path]) -> list[Run]:
    """Every landed cell of one campaign directory or several (the modes' and the peers'); a directory without an
    index is skipped, unless none has one."""
    dirs = [results] if isinstance(results, Path) else list(results)
    indexed = [d for d in dirs if (d / "cells.csv").exists()]
    if not indexed:
        raise typer.BadParameter(
            f"no cells.csv in {', '.join(map(str, dirs))}: run `python -m experiments.campaign run` first"
        )
    runs = []
    for d in indexed:
        with (d / "cells.csv").open(newline="") as f:
            for row in csv.DictReader(f):
                path = d / f"{row['cell']}.csv"
                if not path.exists():
                    continue
                with path.open(newline="") as g:
                    rows = [{k: _float(v) for k, v in r.items()} for r in csv.DictReader(g)]
                n = int(row.get("learners") or 0)
                runs.append(Run(row["cell"], row["env"], row["mode"], int(row["seed"]), float(row["run_s"]), rows, n))
    return runs


def eval_at(run: Run, steps: float) -> float:
    """The deterministic evaluation of the first evaluated round at or past `steps` (NaN when the run stops short)."""
    for r in run.rows:
        if r["env_steps"] >= steps and r["eval_episodes"] > 0 and not math.isnan(r["eval_return"]):
            return r["eval_return"]
    return math.nan


def train_at(run: Run, steps: float, window: float = WINDOW) -> float:
    """Episode-weighted training return of the rounds that ended in (steps - window, steps]."""
    rows = [r for r in run.rows if steps - window < r["env_steps"] <= steps + 2048 and r["episodes"] > 0]
    if not rows:
        return math.nan
    return float(np.average([r["train_return"] for r in rows], weights=[r["episodes"] for r in rows]))


def time_to(run: Run, target: float) -> float:
    """Training wall-clock when the episode-weighted return of the last TARGET_ROUNDS rounds first reaches `target`
    (inf when it never does)."""
    for i in range(len(run.rows)):
        window = [r for r in run.rows[max(0, i + 1 - TARGET_ROUNDS) : i + 1] if r["episodes"] > 0]
        weights = [r["episodes"] for r in window]
        if window and np.average([r["train_return"] for r in window], weights=weights) >= target:
            return run.rows[i]["wall_s"]
    return math.inf


def cost_at(run: Run, steps: float) -> float:
    for r in run.rows:
        if r["env_steps"] >= steps:
            return r["cost"]
    return math.nan


def _by(runs: Sequence[Run]) -> dict[str, dict[str, list[Run]]]:
    """env -> mode -> runs, modes in the page's order."""
    out: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(runs, key=lambda r: (r.env, r.learners, _rank(r.mode), r.seed)):
        out[run.group][run.mode].append(run)
    return out


def _rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def _interval(values: list[float], reps: int) -> stats.Interval | None:
    """The IQM over runs with its interval; None unless every run has a value."""
    return _interval_of(tuple(values), reps)


@functools.lru_cache(maxsize=4096)
def _interval_of(values: tuple[float, ...], reps: int) -> stats.Interval | None:  # tables and goals ask alike
    finite = [v for v in values if math.isfinite(v)]
    return stats.iqm_intervals({"x": finite}, reps=reps)["x"] if len(finite) == len(values) and finite else None


def _cell(iv: stats.Interval | None, digits: int = 0) -> str:
    return "–" if iv is None else f"{iv.point:,.{digits}f} [{iv.low:,.{digits}f}, {iv.high:,.{digits}f}]"


def _median(values: list[float]) -> str:
    reached = [v for v in values if math.isfinite(v)]
    if len(reached) * 2 <= len(values):
        return f"not reached ({len(reached)}/{len(values)})"
    return f"{float(np.median(values)):,.0f} s ({len(reached)}/{len(values)})"


def curves(runs: list[Run], x: str, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM over seeds of the training return against `x` (env_steps or wall_s) on `grid`, with its interval band."""
    ys = []
    for run in runs:
        pts = [(r[x], r["train_return"]) for r in run.rows if r["episodes"] > 0]
        xs, vs = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        y = np.interp(grid, xs, vs, left=np.nan, right=np.nan)
        ys.append(y)
    m = np.vstack(ys)
    whole = np.all(np.isfinite(m), axis=0)  # points every run reaches
    point, low, high = (np.full(len(grid), np.nan) for _ in range(3))
    if whole.any():
        point[whole], low[whole], high[whole] = stats.iqm_curve(m[:, whole], reps=BAND_REPS)
    return point, low, high


def _figure_curves(env: str, modes: dict[str, list[Run]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    max_steps = max(r.rows[-1]["env_steps"] for rs in modes.values() for r in rs)
    max_wall = max(r.rows[-1]["wall_s"] for rs in modes.values() for r in rs)
    for ax, x, grid, label in (
        (axes[0], "env_steps", np.linspace(0, max_steps, GRID_POINTS), "env steps"),
        (axes[1], "wall_s", np.linspace(0, max_wall, GRID_POINTS), "training wall-clock (s)"),
    ):
        for mode, rs in modes.items():
            point, low, high = curves(rs, x, grid)
            ax.plot(grid, point, label=f"{mode} ({len(rs)} seeds)")
            ax.fill_between(grid, low, high, alpha=0.2)
        ax.set_xlabel(label)
        ax.set_ylabel("training return (IQM over seeds)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{env}: training return, IQM and 95 % bootstrap interval over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _figure_costs(by_env: dict[str, dict[str, list[Run]]], path: Path, reps: int) -> None:
    envs = list(by_env)
    modes = sorted({m for e in by_env.values() for m in e}, key=_rank)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        ivs = [_interval([cost_at(r, CHECKPOINTS[-1]) for r in by_env[e].get(mode, [])], reps) for e in envs]
        xs = np.arange(len(envs)) + i * width
        pts = [iv.point if iv else np.nan for iv in ivs]
        err = np.array([[iv.point - iv.low, iv.high - iv.point] if iv else [np.nan, np.nan] for iv in ivs]).T
        ax.bar(xs, pts, width, yerr=err, capsize=3, label=mode)
    ax.set_xticks(np.arange(len(envs)) + width * (len(modes) - 1) / 2, envs)
    ax.set_ylabel(f"cost to {CHECKPOINTS[-1] // 1000}k env steps (USD, IQM)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _figure_profiles(by_env: dict[str, dict[str, list[Run]]], path: Path) -> None:
    """Performance profiles of the evaluation return at the last checkpoint, each env's returns normalised by the
    best run's on it (so envs pool)."""
    modes = sorted({m for e in by_env.values() for m in e}, key=_rank)
    scores: dict[str, np.ndarray] = {}
    for mode in modes:
        cols = []
        for env_modes in by_env.values():
            best = max((eval_at(r, CHECKPOINTS[-1]) for rs in env_modes.values() for r in rs), default=math.nan)
            vals = [eval_at(r, CHECKPOINTS[-1]) / best for r in env_modes.get(mode, [])]
            cols.append(vals)
        n = min((len(c) for c in cols), default=0)
        if n and all(math.isfinite(v) for c in cols for v in c[:n]):
            scores[mode] = np.array([c[:n] for c in cols]).T
    fig, ax = plt.subplots(figsize=(6, 3.6))
    taus = np.linspace(0, 1.05, 43)
    for mode, (frac, low, high) in stats.performance_profile(scores, taus, reps=BAND_REPS).items():
        ax.plot(taus, frac, label=mode)
        ax.fill_between(taus, low, high, alpha=0.2)
    ax.set_xlabel(f"evaluation return at {CHECKPOINTS[-1] // 1000}k steps / best run's on its env (τ)")
    ax.set_ylabel("fraction of runs above τ")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _figure_sweep(by_env: dict[str, dict[str, list[Run]]], path: Path) -> bool:
    """The scale model's N sweep: median wall-clock to the first target and median cost to the last checkpoint,
    against N, a line per mode. False (and no figure) when no run is modelled."""
    points: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for group, modes in by_env.items():
        for mode, rs in modes.items():
            if not rs[0].learners:
                continue
            target = TARGETS.get(base_env(group), (math.nan,))[0]
            t = float(np.median([time_to(r, target) for r in rs]))
            c = float(np.median([cost_at(r, CHECKPOINTS[-1]) for r in rs]))
            points[mode].append((rs[0].learners, t if math.isfinite(t) else math.nan, c))
    if not points:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    envs = sorted({base_env(g) for g in by_env})
    target = TARGETS.get(envs[0], (math.nan,))[0]
    for mode in sorted(points, key=_rank):
        ns, ts, cs = zip(*sorted(points[mode]), strict=True)
        axes[0].plot(ns, ts, marker="o", label=mode)
        axes[1].plot(ns, cs, marker="o", label=mode)
    for ax, label in ((axes[0], f"modelled wall-clock to {target:,.0f} (s, median)"), (axes[1], "cost (USD, median)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learners N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_ylabel(f"modelled cost to {CHECKPOINTS[-1] // 1000}k env steps (USD, median)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{', '.join(envs)}: the scale model's N sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _env_section(env: str, modes: dict[str, list[Run]], img: str, reps: int) -> list[str]:
    lines = [f"## {env}", "", f"![{env}: training return against env steps and wall-clock]({img})", ""]
    targets = TARGETS.get(base_env(env), ())
    head = [
        "mode",
        "seeds",
        *(f"eval IQM at {c // 1000}k" for c in CHECKPOINTS),
        *(f"train IQM at {c // 1000}k" for c in CHECKPOINTS),
        *(f"time to {t:,.0f} (median)" for t in targets),
        f"cost to {CHECKPOINTS[-1] // 1000}k (USD, IQM)",
        "run wall-clock (s, median)",
    ]
    modelled = any(r.learners for rs in modes.values() for r in rs)
    if modelled:  # what the scale model's rules did with the gradients: how many updates, how stale
        head += ["updates a round (median)", "staleness (median)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, rs in modes.items():
        row = [mode, ", ".join(str(r.seed) for r in rs)]
        row += [_cell(_interval([eval_at(r, c) for r in rs], reps)) for c in CHECKPOINTS]
        row += [_cell(_interval([train_at(r, c) for r in rs], reps)) for c in CHECKPOINTS]
        row += [_median([time_to(r, t) for r in rs]) for t in targets]
        row += [_cell(_interval([cost_at(r, CHECKPOINTS[-1]) for r in rs], reps), 4)]
        row += [f"{float(np.median([r.run_s for r in rs])):,.0f}"]
        if modelled:
            row += [_median_of(rs, "aggregations", 0), _median_of(rs, "staleness_mean", 2)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def _median_of(runs: Sequence[Run], column: str, digits: int) -> str:
    """The median over runs of each run's mean of a per-round column; "-" where a run's CSV lacks it (a cell from
    before the column)."""
    means = [
        float(np.mean([r[column] for r in run.rows])) if all(column in r for r in run.rows) else math.nan
        for run in runs
    ]
    if not means or any(math.isnan(m) for m in means):
        return "-"
    return f"{float(np.median(means)):,.{digits}f}"


def goals(by_env: dict[str, dict[str, list[Run]]], reps: int = stats.REPS) -> list[str]:
    """The issue's goals that these runs can speak to, each met or missed with its figures."""
    lines = []
    for env, modes in by_env.items():
        st, sy = modes.get("stellaris"), modes.get("sync")
        if not st or not sy:
            continue
        for c in CHECKPOINTS:
            a, b = _interval([eval_at(r, c) for r in st], reps), _interval([eval_at(r, c) for r in sy], reps)
            if a is None or b is None:
                continue
            verdict = "**missed** (worse beyond the interval)" if b.above(a) else "met (no worse beyond the interval)"
            lines.append(
                f"- {env}, equal env steps ({c // 1000}k): Stellaris's evaluation IQM {a.point:,.0f} "
                f"[{a.low:,.0f}, {a.high:,.0f}] against sync's {b.point:,.0f} [{b.low:,.0f}, {b.high:,.0f}]: "
                f"{_decided(verdict, st, sy)}."
            )
        for t in TARGETS.get(base_env(env), ()):
            ts = [time_to(r, t) for r in st]
            tb = [time_to(r, t) for r in sy]
            ms, mb = float(np.median(ts)), float(np.median(tb))
            if math.isfinite(ms) and math.isfinite(mb):
                ratio = mb / ms
                verdict = _decided("met" if ratio >= 1.5 else "**missed**", st, sy)
                lines.append(
                    f"- {env}, wall-clock to {t:,.0f}: Stellaris {ms:,.0f} s, sync {mb:,.0f} s (medians): "
                    f"{ratio:.2f}x sooner, goal 1.5x: {verdict}."
                )
            else:
                lines.append(
                    f"- {env}, wall-clock to {t:,.0f}: not reached by half the runs of one side "
                    f"(Stellaris {_reached(ts)}, sync {_reached(tb)})."
                )
        lines += _peer_goals(env, modes) + _scale_goals(env, modes, reps)
        x = [eval_at(r, CHECKPOINTS[-1]) for r in st]
        y = [eval_at(r, CHECKPOINTS[-1]) for r in sy]
        if all(map(math.isfinite, x + y)):
            p = stats.probability_of_improvement(x, y, reps=reps)
            lines.append(
                f"- {env}: P(Stellaris > sync) on the evaluation at {CHECKPOINTS[-1] // 1000}k = {p.point:.2f} "
                f"[{p.low:.2f}, {p.high:.2f}]."
            )
    return lines or ["- Too few runs have landed to speak to any goal yet."]


def _peer_goals(env: str, modes: dict[str, list[Run]]) -> list[str]:
    """Hopper's goal against the peers: its first target reached sooner than each peer's, in median wall-clock."""
    if env != "Hopper-v5":  # real runs only: a scale-model group has no peers
        return []
    st, lines, target = modes["stellaris"], [], TARGETS[env][0]
    for peer in PEERS:
        if not modes.get(peer):
            continue
        ts, tp = [time_to(r, target) for r in st], [time_to(r, target) for r in modes[peer]]
        ms, mp = float(np.median(ts)), float(np.median(tp))
        verdict = _decided("met" if ms < mp else "**missed**", st, modes[peer])
        lines.append(
            f"- {env}, wall-clock to {target:,.0f} against {peer}: Stellaris {_seconds(ms)}, {peer} {_seconds(mp)} "
            f"(medians; reached by {_reached(ts)} and {_reached(tp)}): ahead: {verdict}."
        )
    return lines


def _scale_goals(group: str, modes: dict[str, list[Run]], reps: int) -> list[str]:
    """The scale model's goal at N >= 4 (the target sooner is the goals' wall-clock line): a cost to 500k of at most
    0.7x sync's (medians), and an evaluation at 500k no worse than async's beyond the interval."""
    st, sy, asy = modes["stellaris"], modes.get("sync"), modes.get("async")
    if st[0].learners < SCALE_GOAL_LEARNERS:
        return []
    lines = []
    end = CHECKPOINTS[-1]
    if sy:
        cs, cy = float(np.median([cost_at(r, end) for r in st])), float(np.median([cost_at(r, end) for r in sy]))
        if math.isfinite(cs) and math.isfinite(cy) and cy > 0:
            verdict = _decided("met" if cs <= 0.7 * cy else "**missed**", st, sy)
            lines.append(
                f"- {group}: cost to {end // 1000}k, Stellaris ${cs:.4f} against sync's ${cy:.4f} (medians): "
                f"{cs / cy:.2f}x, goal at most 0.7x: {verdict}."
            )
    if asy:
        a, b = _interval([eval_at(r, end) for r in st], reps), _interval([eval_at(r, end) for r in asy], reps)
        if a is not None and b is not None:
            verdict = "**missed** (worse beyond the interval)" if b.above(a) else "met (no worse beyond the interval)"
            lines.append(
                f"- {group}, equal env steps ({end // 1000}k): Stellaris's evaluation IQM {a.point:,.0f} "
                f"[{a.low:,.0f}, {a.high:,.0f}] against async's {b.point:,.0f} [{b.low:,.0f}, {b.high:,.0f}]: "
                f"{_decided(verdict, st, asy)}."
            )
    return lines


def _seconds(t: float) -> str:
    return f"{t:,.0f} s" if math.isfinite(t) else "not reached"


def _decided(verdict: str, *sides: list[Run]) -> str:
    """The verdict, once every side has the seeds its plan holds (MIN_SEEDS; a scale-model N, its plan's); until then,
    what it would be, marked undecided."""
    fewest, need = min(len(side) for side in sides), max(_seeds_needed(side[0]) for side in sides)
    return verdict if fewest >= need else f"undecided ({fewest} of {need} seeds landed; so far: {verdict})"


def _seeds_needed(run: Run) -> int:
    return len(campaign.SCALE_SEEDS.get(run.learners, campaign.SEEDS[:3])) if run.learners else MIN_SEEDS


def _reached(times: list[float]) -> str:
    return f"{sum(map(math.isfinite, times))}/{len(times)}"


def build(
    results: Path | Sequence[Path],
    page: Path,
    *,
    title: str = TITLE,
    title_date: str | None = None,
    reps: int = stats.REPS,
) -> Path:
    """Write the page and its figures from one campaign directory or several; returns the page. `reps`: bootstrap
    replications of the tables' intervals."""
    dirs = [results] if isinstance(results, Path) else [d for d in results if (d / "cells.csv").exists()]
    runs = load(dirs)
    by_env = _by(runs)
    img_dir = page.parent / "img" / page.stem
    img_dir.mkdir(parents=True, exist_ok=True)
    machines = sorted({m for m in _column(dirs, "machine")})
    commits = sorted({m for m in _column(dirs, "commit")})
    finished = sorted(_column(dirs, "finished"))
    days = sorted({f.split()[0] for f in finished})
    modelled = any(r.learners for r in runs)
    title_date = title_date or (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}" if days else None)
    lines = [
        f"# {title}" + (f" ({title_date})" if title_date else ""),
        "",
        "Generated by `python -m experiments.report` from the CSVs in "
        f"{', '.join(f'`{d.as_posix()}/`' for d in dirs)} (one per run, `python -m experiments.campaign run`); "
        "do not edit by hand.",
        "",
        f"- Runs: {len(runs)}, landed {finished[0] if finished else '–'} to {finished[-1] if finished else '–'} "
        f"(UTC), at commits {', '.join(commits) or '–'}.",
        f"- Machine: {'; '.join(machines) or '–'}. One real run at a time"
        + (f"; modelled runs {campaign.MODELLED_JOBS} at a time (their clocks are the model's)." if modelled else "."),
        "- Each run: `stellaris train --preset fast` with its mode and seed, to the env-step budget; a deterministic "
        "evaluation (mean action, 10 episodes, on the run's evaluation seed: its seed + 1,000,003, never a training "
        "env) every 41 rounds of 2,048 steps and at the end: the rows read at 250k and 500k are those at 252k and "
        "502k steps.",
        *(
            [
                "- Peers (`cleanrl`, `sb3`, `rllib`): CleanRL's `ppo_continuous_action.py`, Stable-Baselines3's PPO "
                "and RLlib's (new API stack), each with its own default hyperparameters, run from their released "
                "code to the same 501,760 env steps, evaluated by the same protocol about every 84k steps, and "
                "costed as a serverful run holding one learner slot and one actor core "
                "([Experiments](../experiments.md#the-evaluation-campaign)).",
            ]
            if any(r.mode in PEERS for r in runs)
            else []
        ),
        *(
            [
                "- Modelled runs (N learners): `stellaris plan --learners N` with the timings that real one-learner "
                "runs of the same job and mode measured (`--calibrate`: each mode's validation runs, seeds "
                f"{', '.join(map(str, campaign.SWEEP_CALIBRATION_SEEDS))}); their rewards come from real gradients "
                "on real episodes, their wall-clock and cost from the latency and cost models "
                "([Scale model](../scale-model.md)).",
            ]
            if modelled
            else []
        ),
        "- A cell stopped and resumed (`attempts` above 1 in `cells.csv`) counts every attempt in its run wall-clock; "
        "each restart pays the platform's start again.",
        "- Statistics: interquartile mean (IQM) over seeds with a stratified-bootstrap 95 % interval "
        f"({reps} replications, rliable); time to a return: the training clock when the episode-weighted mean "
        f"of the last {TARGET_ROUNDS} rounds first reaches it, median over seeds (with how many reached it). The "
        "training clock sums the rounds' durations (a peer's: seconds since its training loop began); startup and "
        "evaluations are outside it and in 'run wall-clock' "
        "([Experiments](../experiments.md#the-evaluation-campaign)). Cost: the cost model's "
        "([Experiments](../experiments.md#suites)), cumulative to the checkpoint.",
        "",
        *_progress(dirs, runs),
        "## The goals",
        "",
        *goals(by_env, reps),
        "",
    ]
    for env, modes in by_env.items():
        name = env.split("/")[-1].lower()
        _figure_curves(env, modes, img_dir / f"{name}.png")
        lines += _env_section(env, modes, f"img/{page.stem}/{name}.png", reps)
    if _figure_sweep(by_env, img_dir / "sweep.png"):
        lines += ["## The N sweep", "", f"![The scale model's N sweep](img/{page.stem}/sweep.png)", ""]
    if by_env:
        _figure_costs(by_env, img_dir / "costs.png", reps)
        _figure_profiles(by_env, img_dir / "profiles.png")
        lines += [
            "## Cost and performance profiles",
            "",
            f"![Cost to {CHECKPOINTS[-1] // 1000}k env steps by mode](img/{page.stem}/costs.png)",
            "",
            f"![Performance profiles of the evaluation return at {CHECKPOINTS[-1] // 1000}k]"
            f"(img/{page.stem}/profiles.png)",
            "",
        ]
    page.write_text("\n".join(lines))
    return page


def _progress(dirs: Sequence[Path], runs: Sequence[Run]) -> list[str]:
    """How far each campaign plan has come: its cells landed of its cells, and the hours they took from launch to
    exit (a directory named after a plan is that plan's results)."""
    lines = []
    for d in dirs:
        try:
            planned = campaign.plan_cells(d.name)
        except typer.BadParameter:
            continue  # not a plan's directory (a fixture, a hand-made one)
        ids = {c.id for c in planned}
        landed = [r for r in runs if r.cell in ids]
        hours = sum(r.run_s for r in landed) / 3600
        lines.append(f"- Plan `{d.name}`: {len(landed)} of {len(planned)} cells landed, {hours:.1f} h of runs.")
    return [*lines, ""] if lines else []


def _column(dirs: Sequence[Path], name: str) -> list[str]:
    values = []
    for d in dirs:
        with (d / "cells.csv").open(newline="") as f:
            values += [row[name] for row in csv.DictReader(f) if row.get(name)]
    return values


def main(
    results: list[Path] = typer.Option(list(RESULTS), help="the campaign's CSV directories (repeat the option)"),
    page: Path = typer.Option(PAGE, help="the page to write (figures go beside it, under img/)"),
    title: str = typer.Option(TITLE, help="the page's title"),
) -> None:
    """Rebuild the results page from the committed CSVs."""
    print(build(results, page, title=title))


if __name__ == "__main__":
    typer.run(main)
