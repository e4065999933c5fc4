"""`python -m experiments.campaign run PLAN`: the evaluation campaign, one cell (env × mode × seed) at a time.

Each cell is one `stellaris train` of its own (its own embedded Redis and gateway, as a user runs it), one after
another on an otherwise idle machine. A cell whose CSV is in the results directory is never run again; an interrupted
one resumes from its checkpoint. As a cell lands, its per-round CSV is written under `results/campaign/<plan>/` with a
row in `cells.csv` (its wall-clock, the commit, the machine, the date), and with `--commit` both are committed, so a
campaign can span several working days. `python -m experiments.report` turns the CSVs into the results page
(docs/experiments.md).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console

from experiments import machine, plan_validation
from experiments.peers import venv as peers_venv
from experiments.peers.protocol import PROGRESS_FILE
from experiments.rllib_env import RLlibEnvError, venv_python
from experiments.rllib_suite import serverful_cost_usd
from experiments.summary import read_info
from host.lifetime import dies_with_us

console = Console(stderr=True)
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0] if __doc__ else None)

RESULTS = Path("results/campaign")
RUNS = Path("runs/campaign")
MUJOCO = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5")
MODES = ("stellaris", "sync", "async")
HOPPER_ONLY_MODES = ("softsync", "ssp")
PEERS = ("cleanrl", "sb3", "rllib")  # other libraries' PPO (experiments/peers/), as modes of their own
PEER_ITERATION = 2048  # CleanRL's and SB3's default rollout: a round's worth of env steps, as the fast preset's
RLLIB_EVAL_EVERY = 21  # RLlib's iterations of 4,000 steps between evaluations: 84k steps, as 41 rounds of 2,048
SEEDS = (1, 2, 3, 4, 5)
SCALE_LEARNERS = (1, 2, 4, 8, 16)
SCALE_SEEDS = {1: SEEDS, 4: SEEDS}  # the other N: the first 3 seeds
# What each gradient after an aggregation's first adds to a calibrated apply: the model's own applies of Hopper's fast
# preset took 0.40 ms for one gradient and 1.8 ms for 16 on this machine (docs/scale-model.md)
SCALE_APPLY_PER_GRADIENT_S = 0.0001
# Remedies for Stellaris's learning per env step at N >= 2 (docs/scale-model.md#remedies): a variant's name and the
# flags it adds to the sweep's Stellaris cells, at the N where the sweep found it behind sync
REMEDIES: dict[str, tuple[str, ...]] = {
    "notrunc": ("--set", "stellaris.truncation=false"),  # no truncation across the learners' policies
    "noscale": ("--v", "1e9"),  # no staleness scaling: 1/δ^(1/v) is 1 to nine places
    "each": ("--set", "stellaris.optimizer_steps=each"),  # an Adam step per gradient, one publish per aggregation
    "distance": ("--set", "stellaris.staleness_penalty=distance"),  # Gap-aware: scaled by the parameters' gap
    "each-distance": ("--set", "stellaris.optimizer_steps=each", "--set", "stellaris.staleness_penalty=distance"),
    "cap": ("--set", "stellaris.max_aggregate={n}"),  # an update takes at most N gradients, as a sync step does
}
# An Adam step per gradient costs more than adding it to a sum: the model's own applies here (Hopper, fast preset, 8
# learners, 4 rounds) took about 0.05 ms a gradient more under `each`
REMEDY_APPLY_PER_GRADIENT_S = {"each": 0.00015, "each-distance": 0.00015}
# Where each runs: every remedy at N = 2 and 8; the two that helped there on their first seeds at N = 4 and 16 too;
# the cap where the sweep's updates a round fell below sync's (N >= 4; at N = 2 an update already takes about 2)
REMEDY_LEARNERS: dict[str, tuple[int, ...]] = {
    "notrunc": (2, 4, 8, 16),
    "noscale": (2, 4, 8, 16),
    "each": (2, 8),
    "distance": (2, 8),
    "each-distance": (2, 8),
    "cap": (4, 8, 16),
}
QUEUE = (  # (plan, env): what decides a goal first; "" is every env of the plan
    ("modes", "Hopper-v5"),
    ("peers", "Hopper-v5"),
    ("scale", ""),  # two cells at a time (about 3 h)
    ("remedies", ""),  # two at a time (about 1.5 h)
    ("modes", ""),
    ("peers", ""),
    ("atari", ""),
)
CALIBRATION_SEEDS = (11, 12, 13)  # the validation's held-out real runs of each mode (none of SEEDS)
# The sweep's calibration: all eight real runs of a mode from the validation (SEEDS and CALIBRATION_SEEDS). The
# validation holds three out to check the method; the sweep wants the timings with the least noise, and one run's
# speed varies by up to a fifth (docs/scale-model.md#validation).
SWEEP_CALIBRATION_SEEDS = (*SEEDS, *CALIBRATION_SEEDS)
MODELLED_JOBS = 2  # calibrated modelled cells side by side: one a core
PLAN_NAMES = "modes, atari, peers, scale, remedies or smoke"
MODELLED_PLANS = ("scale", "remedies")  # the queue calibrates their cells by the kept real runs
VALIDATION = Path("results/scale-model/validation-calibrated")
PEER_SEEDS = {"Hopper-v5": SEEDS, "Walker2d-v5": SEEDS[:3], "HalfCheetah-v5": SEEDS[:3]}
ATARI, ATARI_STEPS = "ALE/SpaceInvaders-v5", 200_000
STEPS = 500_000
# Fast preset, 2048 env steps a round: an evaluation every 41 rounds lands at 84k, 168k, 252k, 336k, 420k steps, and
# the run's last round (245, 502k steps) is evaluated too: the rows the report reads at 250k and 500k.
EVAL_EVERY, EVAL_EPISODES = 41, 10
CELL_COLUMNS = [
    "round",
    "env_steps",
    "wall_s",
    "train_return",
    "episodes",
    "eval_return",
    "eval_episodes",
    "cost",
    "staleness_mean",
    "gradients_applied",
    "aggregations",  # the round's updates (a sync step's is one; Stellaris's one per decision to apply)
]
INDEX_COLUMNS = [
    "cell",
    "env",
    "mode",
    "seed",
    "steps",
    "preset",
    "algo",
    "learners",
    "run_s",
    "attempts",
    "rounds",
    "commit",
    "machine",
    "finished",
]
STOPPED = (130, 143, -signal.SIGINT, -signal.SIGTERM)  # `stellaris train` stopped at a checkpoint: it resumes


@dataclass(frozen=True)
class Cell:
    """One run of the campaign: what it trains and for how long; `args` are further flags of its command.
    `learners` > 0 makes it a scale-model cell: `stellaris plan` models that many learners."""

    env: str
    mode: str
    seed: int
    steps: int = STEPS
    algo: str = "ppo"
    preset: str = "fast"
    args: tuple[str, ...] = field(default=())
    learners: int = 0
    variant: str = ""  # a remedy's name (`REMEDIES`): the mode's rule, changed as it says

    @property
    def id(self) -> str:
        env = self.env.split("/")[-1].lower()
        n = f"-n{self.learners}" if self.learners else ""
        return f"{env}-{self.algo}-{self.label}{n}-s{self.seed}"

    @property
    def label(self) -> str:
        """What the results call its mode: the rule, and the remedy where one changed it."""
        return f"{self.mode}-{self.variant}" if self.variant else self.mode

    @property
    def peer(self) -> bool:
        return self.mode in PEERS

    @property
    def starts_over(self) -> bool:
        """A peer or a modelled run has no checkpoint: stopped, it runs again from the start."""
        return self.peer or self.learners > 0

    def command(self, out: Path) -> list[str]:
        if self.peer:
            return self.peer_command(out)
        if self.learners:
            return self._stellaris("plan", out, "--learners", str(self.learners))
        return self._stellaris("train", out)

    def _stellaris(self, command: str, out: Path, *extra: str) -> list[str]:
        """`stellaris train`, or `stellaris plan` of the same job at `learners` learners (docs/scale-model.md, its
        latency knobs in `args`: the campaign's --calibrate), evaluated alike."""
        return [
            sys.executable,
            "-m",
            "stellaris.cli",
            command,
            "--env",
            self.env,
            "--algo",
            self.algo,
            "--preset",
            self.preset,
            "--mode",
            self.mode,
            "--seed",
            str(self.seed),
            *extra,
            "--total-steps",
            str(self.steps),
            "--eval-every",
            str(EVAL_EVERY),
            "--eval-episodes",
            str(EVAL_EPISODES),
            "--out",
            str(out),
            *self.args,
        ]

    def peer_command(self, out: Path) -> list[str]:
        """The peer's script in the peers' venv, to the same env-step budget as the project's cells: CleanRL and SB3
        run as many 2048-step iterations as reach `steps` (the fast preset rounds up alike: 245, 501,760 steps, for
        500k) and are evaluated every 41; RLlib samples 4,000 steps an iteration to 501,760 and is evaluated every
        21 (84k steps, as 41 x 2048). The same 10 deterministic episodes each time."""
        rounds = math.ceil(self.steps / PEER_ITERATION)
        budget = (
            ["--steps", str(rounds * PEER_ITERATION), "--eval-every", str(RLLIB_EVAL_EVERY)]
            if self.mode == "rllib"
            else ["--rounds", str(rounds), "--eval-every", str(EVAL_EVERY)]
        )
        source = ["--source", str(peers_venv.cleanrl_source())] if self.mode == "cleanrl" else []
        return [
            str(venv_python(peers_venv.venv_path())),
            "-m",
            f"experiments.peers.{self.mode}_ppo",
            *source,
            "--env",
            self.env,
            "--seed",
            str(self.seed),
            *budget,
            "--eval-episodes",
            str(EVAL_EPISODES),
            "--out",
            str(out),
            *self.args,
        ]


def plan_cells(name: str, *, seeds: Iterable[int] = SEEDS, steps: int = STEPS) -> list[Cell]:
    """The cells of a plan, seed-major, so a campaign cut short still holds every mode on its first seeds.

    `modes`: stellaris, sync and async on Hopper, Walker2d and HalfCheetah, and softsync and SSP on Hopper.
    `atari`: stellaris, sync and async on SpaceInvaders, 3 seeds, at `ATARI_STEPS` (what fits this machine).
    `scale`: the scale model of stellaris, sync and async on Hopper at N = 1, 2, 4, 8 and 16 learners, 3 seeds (5
    at N = 1 and 4).
    `peers`: CleanRL's, Stable-Baselines3's and RLlib's PPO on the three MuJoCo envs, 5 seeds on Hopper and 3 on
    the others.
    `remedies`: the scale model of Stellaris on Hopper with each of `REMEDIES`, at its `REMEDY_LEARNERS`, 3 seeds.
    `smoke`: a short Hopper stellaris/sync pair (what the report's fixture and a first try use)."""
    seeds = tuple(seeds)
    if name == "modes":
        cells = []
        for seed in seeds:
            for env in MUJOCO:
                modes = MODES + (HOPPER_ONLY_MODES if env == "Hopper-v5" else ())
                cells += [Cell(env, mode, seed, steps) for mode in modes]
        return cells
    if name == "atari":
        return [Cell(ATARI, mode, seed, min(steps, ATARI_STEPS)) for seed in seeds[:3] for mode in MODES]
    if name == "peers":
        return [
            Cell(env, mode, seed, steps, preset="defaults")
            for seed in seeds
            for env in MUJOCO
            if seed in PEER_SEEDS[env]
            for mode in PEERS
        ]
    if name == "scale":
        return [
            Cell(
                "Hopper-v5",
                mode,
                seed,
                steps,
                args=("--apply-per-gradient-s", str(SCALE_APPLY_PER_GRADIENT_S)),
                learners=n,
            )
            for seed in seeds
            for n in SCALE_LEARNERS
            if seed in SCALE_SEEDS.get(n, SEEDS[:3])
            for mode in MODES
        ]
    if name == "remedies":
        return [
            Cell(
                "Hopper-v5",
                "stellaris",
                seed,
                steps,
                args=(
                    *(flag.format(n=n) for flag in flags),
                    "--apply-per-gradient-s",
                    str(REMEDY_APPLY_PER_GRADIENT_S.get(variant, SCALE_APPLY_PER_GRADIENT_S)),
                ),
                learners=n,
                variant=variant,
            )
            for seed in seeds[:3]
            for n in sorted({m for ns in REMEDY_LEARNERS.values() for m in ns})
            for variant, flags in REMEDIES.items()
            if n in REMEDY_LEARNERS[variant]
        ]
    if name == "smoke":
        return [Cell("Hopper-v5", mode, seed, steps) for seed in seeds for mode in ("stellaris", "sync")]
    raise typer.BadParameter(f"unknown plan {name!r}: choose {PLAN_NAMES}", param_hint="PLAN")


def cell_rows(run: Path) -> list[dict[str, Any]]:
    """A finished run's per-round rows, as the campaign keeps them: the training clock (`wall_s`, the rounds'
    durations summed from the first), the mean return of the episodes finished in the round, the deterministic
    evaluation where one ran, the cumulative cost."""
    rows, wall = [], 0.0
    for r in read_info(run):
        wall += r["duration"]
        rows.append(_kept(r, wall))
    return rows


def plan_rows(run: Path, learners: int) -> list[dict[str, Any]]:
    """A modelled run's rows (`stellaris plan`'s learners-N.csv, info.csv's columns) as the campaign keeps a cell's:
    its clock and cost are the model's."""
    return [_kept(r, r["wall_clock_s"]) for r in read_info(run, f"learners-{learners}.csv")]


def _kept(r: dict[str, float], wall_s: float) -> dict[str, Any]:
    """One round of info.csv's columns (as floats) as a row of the campaign's, at training clock `wall_s`."""
    return {
        "round": int(r["round_id"]),
        "env_steps": int(r["env_steps"]),
        "wall_s": round(wall_s, 3),
        "train_return": _num(r["train_reward_mean"]),
        "episodes": int(r["episodes"]),
        "eval_return": _num(r.get("eval_reward_mean", math.nan)),
        "eval_episodes": int(r.get("eval_episodes") or 0),
        "cost": _num(r["cost"], 6),
        "staleness_mean": _num(r.get("staleness_mean", math.nan), 3),
        "gradients_applied": int(r.get("gradients_applied") or 0),
        "aggregations": int(r.get("aggregations") or 0),
    }


def peer_rows(run: Path) -> list[dict[str, Any]]:
    """A finished peer's rows (experiments/peers/protocol.py), costed as a serverful run holding one learner slot and
    one actor core for its training clock (experiments/rllib_suite.py: what the project's own cells pay per
    resource-second)."""
    rows = []
    with (run / PROGRESS_FILE).open(newline="") as f:
        for r in csv.DictReader(f):
            wall = float(r["wall_s"])
            learner, actor = serverful_cost_usd(wall, cores=1, learners=1)
            rows.append(
                {
                    **{k: r[k] for k in ("round", "env_steps", "wall_s", "train_return", "episodes")},
                    "eval_return": r["eval_return"],
                    "eval_episodes": r["eval_episodes"],
                    "cost": round(learner + actor, 6),
                    "staleness_mean": "",
                    "gradients_applied": "",
                    "aggregations": "",
                }
            )
    return rows


def _num(x: float, digits: int = 2) -> float | str:
    return "" if x is None or math.isnan(x) else round(float(x), digits)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]], *, append: bool = False) -> None:
    """Write `rows`, or append them; a file written with other columns is rewritten with these first (an index from
    before a column was added gets it, blank), so that no row lands under another's header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if append and path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            earlier, header = list(reader), reader.fieldnames
        if header != columns:
            if header and set(header) - set(columns):
                raise ValueError(f"{path} has columns {sorted(set(header) - set(columns))} that {columns} lacks")
            write_csv(path, columns, [{c: r.get(c, "") for c in columns} for r in earlier])
    new = not path.exists() or not append
    with path.open("a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        if new:
            w.writeheader()
        w.writerows(rows)


def finished(results: Path) -> set[str]:
    """The cells whose CSV has landed."""
    index = results / "cells.csv"
    if not index.exists():
        return set()
    with index.open(newline="") as f:
        return {row["cell"] for row in csv.DictReader(f) if (results / f"{row['cell']}.csv").exists()}


_RECORDING = threading.Lock()  # modelled cells may finish side by side: one writes to the index at a time


def run_cell(cell: Cell, results: Path, runs: Path) -> tuple[str, float]:
    """Run (or resume) one cell; on success write its CSV and its index row. Returns (status, seconds)."""
    out = runs / cell.id
    if cell.starts_over and out.exists():
        # no checkpoint to resume: an interrupted one starts over, and its earlier try does not count
        shutil.rmtree(out)
    cmd = (
        [sys.executable, "-m", "stellaris.cli", "train", "--resume", str(out)]
        if (out / "state.json").exists()
        else cell.command(out)
    )
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with (runs / f"{cell.id}.log").open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_us())
        try:
            code = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGTERM)  # `stellaris train` stops at a checkpoint: the cell resumes next time
            proc.wait()
            raise
    seconds = time.monotonic() - t0
    spent = runs / f"{cell.id}.attempts"  # earlier attempts' seconds, one line each: the cell's wall-clock sums them
    earlier = [float(x) for x in spent.read_text().split()] if spent.exists() else []
    if code in STOPPED and not cell.starts_over and (out / "state.json").exists():  # else it starts over, uncounted
        spent.write_text("".join(f"{x}\n" for x in [*earlier, round(seconds, 1)]))
        return f"interrupted at a checkpoint (exit {code}); run the campaign again to resume it", seconds
    if code in STOPPED:
        return f"stopped (exit {code}); run the campaign again to start it over", seconds
    if code != 0:
        return f"failed (exit {code}; see {runs / f'{cell.id}.log'})", seconds
    rows = peer_rows(out) if cell.peer else plan_rows(out, cell.learners) if cell.learners else cell_rows(out)
    with _RECORDING:
        _record(cell, results, rows, seconds + sum(earlier), len(earlier) + 1)
    return "done", seconds


def _record(cell: Cell, results: Path, rows: list[dict[str, Any]], seconds: float, attempts: int) -> None:
    """A finished cell's CSV, and its row in the index."""
    write_csv(results / f"{cell.id}.csv", CELL_COLUMNS, rows)
    write_csv(
        results / "cells.csv",
        INDEX_COLUMNS,
        [
            {
                "cell": cell.id,
                "env": cell.env,
                "mode": cell.label,
                "seed": cell.seed,
                "steps": cell.steps,
                "preset": cell.preset,
                "algo": cell.algo,
                "learners": cell.learners or "",
                "run_s": round(seconds, 1),
                "attempts": attempts,
                "rounds": len(rows),
                "commit": _commit(),
                "machine": machine.describe(),
                "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
            }
        ],
        append=True,
    )


def _git_commit(results: Path, cell: Cell) -> None:
    paths = [str(results / f"{cell.id}.csv"), str(results / "cells.csv")]
    subprocess.run(["git", "add", *paths], check=True)
    subprocess.run(["git", "commit", "-q", "-m", f"campaign: {cell.id}", "--", *paths], check=True)


def _ready_peers(cells: list[Cell]) -> None:
    """The peers' venv (made if missing) and, for CleanRL's cells, its clone; refuses naming what is missing."""
    try:
        peers_venv.ensure_venv(echo=console.print)
    except RLlibEnvError as exc:
        raise typer.BadParameter(str(exc), param_hint="peers") from exc
    source = peers_venv.cleanrl_source()
    if any(c.mode == "cleanrl" for c in cells) and not (source / peers_venv.CLEANRL_SCRIPT).is_file():
        raise typer.BadParameter(
            f"CleanRL's cells need a clone of https://github.com/vwxyzjn/cleanrl at {source} (commit "
            f"{peers_venv.CLEANRL_COMMIT} ran the published cells), or ${peers_venv.CLEANRL_ENV_VAR} pointing at one",
            param_hint="peers",
        )


def _selected(plan: str, seeds: str, steps: int, env: str, calibrate: Sequence[Path] = ()) -> list[Cell]:
    """The plan's cells for these seeds and steps, of one env when given, with each scale cell calibrated by the runs
    of its mode among `calibrate`."""
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"seeds must be integers separated by commas, got {seeds!r}") from None
    cells = plan_cells(plan, seeds=seed_list, steps=steps)
    if env and env not in {c.env for c in cells}:
        raise typer.BadParameter(
            f"{env!r} is not in the plan {plan!r}: choose one of {', '.join(sorted({c.env for c in cells}))}",
            param_hint="--env",
        )
    cells = [c for c in cells if not env or c.env == env]
    by_mode = _calibration_by_mode(calibrate)
    if not by_mode:
        return cells
    missing = sorted({c.mode for c in cells if c.learners} - set(by_mode))
    if missing:
        raise typer.BadParameter(
            f"no calibration run of mode {missing[0]!r} among {', '.join(map(str, calibrate))}: a modelled cell takes "
            "the timings of real runs of its own mode",
            param_hint="--calibrate",
        )
    return [replace(c, args=(*c.args, *by_mode[c.mode])) if c.learners else c for c in cells]


def _calibration_by_mode(calibrate: Sequence[Path]) -> dict[str, tuple[str, ...]]:
    """The --calibrate flags for each mode's cells: every run of that mode (from its config.yaml). Sync's cells also
    take the tasks' jitter from the Stellaris runs (--jitter-from), those with their gradients' arrivals: a sync
    learner's arrivals hold its applies and waits, so its own do not measure it (docs/scale-model.md#calibration)."""
    by_mode: dict[str, tuple[str, ...]] = {}
    jitter_from: list[Path] = []
    for run_dir in calibrate:
        if not (run_dir / "info.csv").is_file() or not (run_dir / "config.yaml").is_file():
            raise typer.BadParameter(
                f"{run_dir} has no info.csv or config.yaml: give a real run's directory", param_hint="--calibrate"
            )
        mode = str((yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("config", {}).get("mode"))
        by_mode[mode] = (*by_mode.get(mode, ()), "--calibrate", str(run_dir))
        jitter_from += [run_dir] if mode == "stellaris" and (run_dir / "gradients.csv").is_file() else []
    if "sync" in by_mode and jitter_from:
        by_mode["sync"] += tuple(arg for run_dir in jitter_from for arg in ("--jitter-from", str(run_dir)))
    return by_mode


@app.command()
def run(
    plan: str = typer.Argument(..., help=PLAN_NAMES),
    seeds: str = typer.Option(",".join(map(str, SEEDS)), help="comma-separated seeds"),
    steps: int = typer.Option(STEPS, min=2048, help="env steps per run"),
    results: Path = typer.Option(None, help="where the CSVs land (default results/campaign/PLAN)"),
    runs: Path = typer.Option(RUNS, help="where the run directories go (not committed)"),
    env: str = typer.Option("", help="only this env's cells, e.g. Hopper-v5 (default: every env of the plan)"),
    calibrate: list[Path] = typer.Option(
        [],
        help="scale: a real one-learner run whose timings its mode's cells take (stellaris plan --calibrate; repeat)",
    ),
    limit: int = typer.Option(0, min=0, help="run at most this many cells now (0: all)"),
    commit: bool = typer.Option(False, help="git-commit each cell's CSV as it lands"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the cells that would run, and run none"),
    jobs: int = typer.Option(
        1, min=1, max=64, help="calibrated modelled cells side by side (every other cell runs alone)"
    ),
    other_machine: bool = typer.Option(
        False, "--other-machine", help="run measured cells on a machine other than the one the plan's cells ran on"
    ),
) -> None:
    """Run the plan's unfinished cells, one at a time (calibrated modelled ones `--jobs` at a time); finished ones
    are skipped."""
    cells = _selected(plan, seeds, steps, env, calibrate)
    results = results or RESULTS / plan
    if not other_machine:
        _check_machine(cells, results)
    _run_cells(plan, cells, results, runs, limit=limit, commit=commit, dry_run=dry_run, jobs=jobs)


MEASURED_PLANS = ("modes", "peers", "atari")  # their cells' wall-clock compares across plans, env by env


def elsewhere(cells: Sequence[Cell], results: Path) -> dict[str, list[str]]:
    """The envs of `cells`' measured ones whose landed cells ran on other machines (each env's runs, of every
    measured plan beside `results`, compare in wall-clock only on one machine), with those machines. A calibrated
    modelled cell's clock is its calibration's: it runs anywhere."""
    envs = {c.env for c in cells if not calibrated(c)}
    indexes = {results / "cells.csv", *(results.parent / plan / "cells.csv" for plan in MEASURED_PLANS)}
    machines: dict[str, set[str]] = defaultdict(set)
    for index in filter(Path.exists, indexes):
        with index.open(newline="") as f:
            for row in csv.DictReader(f):
                if row.get("env") in envs and row.get("machine"):
                    machines[row["env"]].add(row["machine"])
    here = machine.describe()
    return {env: sorted(ran) for env, ran in sorted(machines.items()) if here not in ran}


def _where(away: dict[str, list[str]]) -> str:
    """`elsewhere`'s envs and machines in a line: "Hopper-v5 on 'AMD EPYC, 2 cores, 24 GiB'"."""
    return "; ".join(f"{env} on {' and '.join(map(repr, ran))}" for env, ran in away.items())


def _check_machine(cells: Sequence[Cell], results: Path) -> None:
    """Refuse measured cells of an env whose landed cells ran on another machine, naming both machines."""
    away = elsewhere(cells, results)
    if away:
        raise typer.BadParameter(
            f"this machine is {machine.describe()!r}; the landed cells of {_where(away)}, and a measured cell's "
            "wall-clock only compares with theirs: run them there, choose another --env, or pass --other-machine",
            param_hint="plan",
        )


def _run_cells(
    plan: str,
    cells: list[Cell],
    results: Path,
    runs: Path,
    *,
    limit: int = 0,
    commit: bool,
    dry_run: bool = False,
    jobs: int = 1,
) -> None:
    alone = [c.id for c in cells if not calibrated(c)]
    if jobs > 1 and alone:
        raise typer.BadParameter(
            f"{alone[0]} is not a calibrated modelled cell: only those run side by side", param_hint="--jobs"
        )
    done = finished(results)
    todo = [c for c in cells if c.id not in done]
    console.print(f"{plan}: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run")
    if not dry_run and any(c.peer for c in todo):
        _ready_peers(todo)
    if dry_run:
        for cell in todo[: limit or None]:
            console.print(f"would run {cell.id}: {' '.join(cell.command(runs / cell.id)[3:])}")
        return
    todo = todo[: limit or None]
    if jobs > 1:
        _run_side_by_side(todo, results, runs, jobs=jobs, commit=commit)
        return
    for i, cell in enumerate(todo, 1):
        console.print(f"[{i}/{len(todo)}] {cell.id} ...", end=" ")
        status, seconds = run_cell(cell, results, runs)
        console.print(f"{status} in {seconds:.0f} s")
        if status != "done":
            raise typer.Exit(1)
        if commit:
            _git_commit(results, cell)


def calibrated(cell: Cell) -> bool:
    """A modelled cell whose every timing comes from calibration runs: its modelled clock does not depend on what
    else the machine runs, so such cells may run side by side (docs/scale-model.md#calibration)."""
    return cell.learners > 0 and "--calibrate" in cell.args


def _run_side_by_side(todo: list[Cell], results: Path, runs: Path, *, jobs: int, commit: bool) -> None:
    """Calibrated modelled cells, `jobs` at a time, each committed as it lands (a measured run's wall-clock is what
    it is for: it runs alone)."""
    failed = False
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(run_cell, cell, results, runs): cell for cell in todo}
        for i, future in enumerate(as_completed(running), 1):
            cell, (status, seconds) = running[future], future.result()
            console.print(f"[{i}/{len(todo)}] {cell.id} {status} in {seconds:.0f} s")
            failed |= status != "done"
            if commit and status == "done":
                _git_commit(results, cell)
    if failed:
        raise typer.Exit(1)


def _make_kept_runs() -> None:
    """The sweep's calibration runs not kept yet (a fresh checkout has the committed ones), each a real 40-round run."""
    for mode in MODES:
        for seed in SWEEP_CALIBRATION_SEEDS:
            try:
                plan_validation.kept_run("Hopper-v5", mode, seed)
            except subprocess.CalledProcessError as exc:
                console.print(f"calibration run {mode} seed {seed} failed (exit {exc.returncode}); the sweep will say")


@app.command()
def queue(
    commit: bool = typer.Option(True, help="git-commit each cell's CSV, and the validation's, as they land"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the steps and what each would run, and run none"),
) -> None:
    """The whole campaign in the order that decides a goal first (docs/experiments.md): the scale model's validation
    of each mode, calibrated by held-out runs of that mode; Hopper's modes; the scale sweep (each mode calibrated by
    its runs); Hopper's peers; the rest of the modes and the peers; Atari. A step stopped by a failed cell is left
    for the next time, and the queue goes on; run it again to take up what is left."""
    calibration = [plan_validation.kept_path(mode, seed) for mode in MODES for seed in SWEEP_CALIBRATION_SEEDS]
    held_out = ",".join(map(str, CALIBRATION_SEEDS))
    for mode in MODES:
        validation = [sys.executable, "-m", "experiments.plan_validation", "--mode", mode]
        validation += ["--calibrate-seeds", held_out]
        console.print(f"validation: {' '.join(validation[1:])}")
        if not dry_run:
            subprocess.run(validation, check=False)
    console.print(f"the sweep's calibration: {len(calibration)} kept real runs, those missing made one at a time")
    if not dry_run:
        _make_kept_runs()
    if not dry_run and commit:
        kept = [str(path) for path in (VALIDATION, plan_validation.KEPT) if path.exists()]
        subprocess.run(["git", "add", *kept], check=True)
        message = "scale model: the validation at N = 1 and its kept real runs"
        subprocess.run(["git", "commit", "-q", "-m", message, "--", *kept], check=False)
    for plan, env in QUEUE:
        step = f"{plan} {env or '(every env)'}"
        try:
            modelled = plan in MODELLED_PLANS
            cells = _selected(plan, ",".join(map(str, SEEDS)), STEPS, env, calibration if modelled else ())
            jobs = MODELLED_JOBS if modelled else 1
            away = elsewhere(cells, RESULTS / plan)
            if away:
                console.print(f"{step}: left for the machine each env's cells ran on ({_where(away)})")
                cells = [c for c in cells if c.env not in away]
            _run_cells(plan, cells, RESULTS / plan, RUNS, commit=commit, dry_run=dry_run, jobs=jobs)
        except typer.BadParameter as exc:  # the scale step without its calibration run, the peers without CleanRL
            console.print(f"{step}: skipped: {exc}; the queue goes on")
        except typer.Exit:
            console.print(f"{step}: stopped at a failed cell; the queue goes on")


@app.command()
def status(
    plan: str = typer.Argument(..., help=PLAN_NAMES),
    results: Path = typer.Option(None),
) -> None:
    """Which cells of the plan have landed."""
    cells = plan_cells(plan)
    done = finished(results or RESULTS / plan)
    for cell in cells:
        console.print(f"{'done' if cell.id in done else '    '}  {cell.id}")
    console.print(f"{len(done & {c.id for c in cells})} of {len(cells)} cells landed")


if __name__ == "__main__":
    app()
