"""`python -m experiments.elastic`: fixed vs elastic actors while learner capacity changes mid-run (issue 16, ARTOS
§4). Both arms run `stellaris train` on the same env, preset, seed and learner schedule (e.g. 2 learners, 4 from
round 11); the elastic arm adapts its actor count. Alternated A B A B … (fixed first in every pair, as
experiments/bench.py does) and reported per arm as the median over the pairs with its min–max: rounds for the actor
count to follow the learner change, the learners' mean wait for batches after it, cost, env steps/s; then the
elastic/fixed ratios.

    python -m experiments.elastic --pairs 3 --rounds 24 --change-round 11
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from experiments.bench import Spread, ours_rate
from experiments.summary import read_info

ARMS = ("fixed", "elastic")
SMALL_BATCH = ["--set", "train_batch_size=512", "--set", "num_minibatches=8", "--set", "num_epochs=4"]


def follow_rounds(info: Sequence[dict[str, float]], change_round: int) -> float:
    """Rounds from the learner change to the first change of the actor count at or after the round before it (a
    planned scale-up is pre-warmed a round early, so -1 is possible); NaN when the count never moved."""
    for row in info:
        if row["round_id"] >= change_round - 1 and row.get("actor_change", 0.0) != 0:
            return row["round_id"] + 1 - change_round  # a change decided at round k's end serves round k + 1
    return math.nan


def wait_after(info: Sequence[dict[str, float]], change_round: int) -> float:
    """The learners' mean wait for batches (batch_wait_s) over the rounds from the learner change on."""
    waits = [row["batch_wait_s"] for row in info if row["round_id"] >= change_round]
    return sum(waits) / len(waits)


def run_arm(arm: str, args: list[str], out: Path) -> list[dict[str, float]]:
    cmd = [sys.executable, "-m", "stellaris.cli", "train", *args, "--out", str(out)]
    if arm == "elastic":
        cmd.append("--elastic-actors")
    log = out.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise RuntimeError(f"{arm} run failed ({code}): {log.read_text()[-2000:]}")
    return read_info(out)


def fmt(s: Spread, spec: str) -> str:
    return f"{s.median:{spec}} ({s.lo:{spec}}–{s.hi:{spec}})"


def main(
    env: str = typer.Option("Hopper-v5", help="Gymnasium env id"),
    pairs: int = typer.Option(3, min=1, help="A/B pairs (fixed, elastic)"),
    rounds: int = typer.Option(24, min=4, help="rounds per run"),
    change_round: int = typer.Option(11, min=2, help="the round the learners change"),
    learners: str = typer.Option("2,4", help="learners before,after the change"),
    actors: int = typer.Option(1, min=1, help="actors of the fixed arm, and the elastic arm's first count"),
    max_actors: int = typer.Option(4, min=1, help="the elastic arm's most actors"),
    seed: int = typer.Option(1),
) -> None:
    before, after = (int(x) for x in learners.split(","))
    args = ["--env", env, "--preset", "fast", "--rounds", str(rounds), "--seed", str(seed), "--actors", str(actors)]
    args += ["--learners", str(before), "--learner-schedule", f"{before}@1,{after}@{change_round}"]
    args += ["--min-actors", "1", "--max-actors", str(max_actors), *SMALL_BATCH]
    console = Console()
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="elastic-") as tmp:
        for i in range(pairs):
            for arm in ARMS:
                console.print(f"pair {i + 1}/{pairs}: {arm}")
                info = run_arm(arm, args, Path(tmp) / f"{arm}-{i}")
                results[arm].append(
                    {
                        "follow": follow_rounds(info, change_round),
                        "wait": wait_after(info, change_round),
                        "cost": info[-1]["cost"],
                        "cost_actor": info[-1]["cost_actor"],
                        "rate": ours_rate(info),
                        "actors_end": info[-1]["actors"],
                    }
                )
    table = Table(title=f"{env}: learners {before}→{after} at round {change_round}, {rounds} rounds, {pairs} pairs")
    for column in ("metric", *ARMS, "elastic / fixed"):
        table.add_column(column)
    metrics = [
        ("rounds for actors to follow", "follow", ".0f"),
        ("batch_wait_s after change", "wait", ".3f"),
        ("actors at the end", "actors_end", ".0f"),
        ("cost $", "cost", ".5f"),
        ("actor cost $", "cost_actor", ".5f"),
        ("env steps/s", "rate", ".0f"),
    ]
    for label, key, spec in metrics:
        cells = []
        for arm in ARMS:
            values = [r[key] for r in results[arm] if not math.isnan(r[key])]
            cells.append(fmt(Spread.of(values), spec) if values else "-")
        both = zip(results["fixed"], results["elastic"], strict=True)
        ratios = [e[key] / f[key] for f, e in both if f[key] > 0 and e[key] > 0]  # NaN compares False: left out
        table.add_row(label, *cells, fmt(Spread.of(ratios), ".2f") if ratios else "-")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
