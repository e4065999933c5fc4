"""`python -m experiments.bench_startup`: how long a short `stellaris train` job takes outside its rounds, this
checkout (A) against another one (B, `--baseline DIR`, e.g. a `git worktree` of an older commit), alternated
A B A B A B.

Each job is `python -m stellaris.cli train --env E --rounds R` run from the side's directory (so the trainer, the
gateway and every instance import that side's code), timed from its start by the lines it prints:
- setup: to the `run directory:` line (Redis, gateway, parameter instance and job init, learners warm, actors
  started);
- first round: from there to round 1's line (round 1 includes any actor start still under way);
- finish: from the last round's line to the `done:` line (actors stopped, functions deleted, outputs closed);
- exit: from the `done:` line to the process's exit;
- total: start to exit.
Reports the median and min–max over the pairs of each phase, and the ratio A/B of the medians.

    python -m experiments.bench_startup --baseline /tmp/base [--env Hopper-v5] [--rounds 1] [--pairs 3] [--json F]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console

from experiments.bench import Row, Spread, render, write_json

PHASES = ("setup", "first round", "finish", "exit", "total")


def timed_job(checkout: Path, env: str, rounds: int, seed: int, out: Path) -> dict[str, float]:
    """One job run from `checkout`: the seconds of each phase (PHASES)."""
    cmd = [sys.executable, "-m", "stellaris.cli", "train", "--env", env, "--preset", "fast"]
    cmd += ["--rounds", str(rounds), "--seed", str(seed), "--out", str(out)]
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    with subprocess.Popen(cmd, cwd=checkout, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.monotonic() - t0
            if line.startswith("run directory:"):
                marks["setup"] = now
            elif line.startswith("round "):
                marks.setdefault("round 1", now)
                marks["last round"] = now
            elif line.startswith("done:"):
                marks["done"] = now
    end = time.monotonic() - t0
    if proc.returncode != 0 or set(marks) != {"setup", "round 1", "last round", "done"}:
        raise RuntimeError(f"{' '.join(cmd)} in {checkout}: exit {proc.returncode}, saw {sorted(marks)}")
    return {
        "setup": marks["setup"],
        "first round": marks["round 1"] - marks["setup"],
        "finish": marks["done"] - marks["last round"],
        "exit": end - marks["done"],
        "total": end,
    }


def rows_of(ours: list[dict[str, float]], base: list[dict[str, float]], baseline: Path) -> list[Row]:
    rows = []
    for phase in PHASES:
        a, b = Spread.of([r[phase] for r in ours]), Spread.of([r[phase] for r in base])
        rows.append(
            Row(
                f"short job: {phase} (s)",
                f"{a.median:.2f} ({a.lo:.2f}-{a.hi:.2f})",
                f"{b.median:.2f} ({b.lo:.2f}-{b.hi:.2f})",
                a.median / b.median if b.median > 0 else float("nan"),
                f"{len(ours)} pairs alternated; baseline: {baseline}",
            )
        )
    return rows


def main(
    baseline: Path = typer.Option(..., exists=True, file_okay=False, help="the checkout to compare against (B)"),
    env: str = typer.Option("Hopper-v5", help="the environment"),
    rounds: int = typer.Option(1, min=1, help="rounds per job"),
    pairs: int = typer.Option(3, min=1, help="A/B pairs"),
    json_path: Path | None = typer.Option(None, "--json", help="also write the rows here, as a JSON list"),
) -> None:
    console = Console()
    here = Path(__file__).resolve().parent.parent
    ours: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for i in range(pairs):
            for side, checkout, into in (("A", here, ours), ("B", baseline.resolve(), base)):
                into.append(timed_job(checkout, env, rounds, 1, Path(tmp) / f"{side}{i}"))
                console.print(f"pair {i + 1} {side}: " + ", ".join(f"{k} {v:.2f} s" for k, v in into[-1].items()))
    rows = rows_of(ours, base, baseline)
    render(rows, console)
    if json_path is not None:
        write_json(rows, json_path)


if __name__ == "__main__":
    typer.run(main)
