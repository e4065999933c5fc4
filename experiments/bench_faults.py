"""`python -m experiments.bench_faults`: what a killed function instance costs a job, side by side in one run.

`stellaris train` (fast preset, `--learners` learners (2), 2 serverful actors) runs without kills (A) and with them
(B), alternated A B A B A B. In B, once every `--kill-every` rounds a busy instance of `--role` is killed with
SIGKILL at a random moment of the next round (uniform over the rounds' measured length, so a kill may land in
collection as well as in learning). Reports, with the median and min–max over the pairs: the job's round seconds
(rounds 2..N summed) each side and their ratio, and the cost of one kill, (B − A) / kills, against an unhurt
round's median.

    python -m experiments.bench_faults [--rounds 31] [--kill-every 5] [--pairs 3] [--role learner] [--learners 2]
        [--standby 0] [--json F]
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from experiments.bench import Row, Spread
from experiments.proc_cpu import busy, descendants_running
from experiments.summary import read_info

MARKERS = {"learner": "handlers.learner:", "parameter": "handlers.parameter:", "actor": "functions.actor.loop"}
ROUND_LINE = re.compile(r"round (\d+) env_steps ")


@dataclass
class Run:
    """One job: its rounds' seconds (rounds 2..N), the kills made, and the restarts its info.csv counts."""

    round_s: list[float]
    kills: int
    restarts: int


def _kill_one(root: int, marker: str, rng: random.Random, killed: list[int]) -> None:
    candidates = descendants_running(root, marker)
    victims = busy(candidates) or candidates  # a busy instance, not an idle warm spare, where one is busy
    if victims:
        victim = rng.choice(victims)
        try:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
        except ProcessLookupError:
            pass


def run_job(
    env: str,
    rounds: int,
    seed: int,
    tmp: Path,
    *,
    role: str,
    kill_every: int | None,
    learners: int = 2,
    standby: int = 0,
) -> Run:
    """One `stellaris train` job (`standby` warm spares); with `kill_every`, a busy `role` instance killed once every
    that many rounds (never in round 1, while the job starts), at a random moment of the round after the one just
    logged."""
    out = tmp / f"run-{seed}-{'kills' if kill_every else 'none'}"
    cmd = [sys.executable, "-m", "stellaris.cli", "train", "--env", env, "--preset", "fast", "--rounds", str(rounds)]
    cmd += ["--seed", str(seed), "--learners", str(learners), "--actors", "2", "--standby", str(standby)]
    cmd += ["--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rng = random.Random(seed)
    killed: list[int] = []
    timers: list[threading.Timer] = []
    gaps: list[float] = []
    last_at: float | None = None
    tail: list[str] = []
    for line in proc.stdout or []:
        tail = [*tail[-39:], line]
        logged = ROUND_LINE.match(line)
        if not logged:
            continue
        k, now = int(logged[1]), time.monotonic()
        if last_at is not None:
            gaps.append(now - last_at)
        last_at = now
        if kill_every and k >= 2 and k % kill_every == 0 and k < rounds and gaps:
            delay = rng.uniform(0.0, statistics.median(gaps))
            timer = threading.Timer(delay, _kill_one, (proc.pid, MARKERS[role], rng, killed))
            timer.start()
            timers.append(timer)
    proc.wait()
    for timer in timers:
        timer.cancel()
    if proc.returncode != 0:
        raise RuntimeError(f"stellaris train failed ({proc.returncode}): {''.join(tail)}")
    info = read_info(out)
    return Run([r["duration"] for r in info[1:]], len(killed), int(sum(r[f"{role}_restarts"] for r in info)))


def rows_of(pairs: list[tuple[Run, Run]], role: str, kill_every: int) -> list[Row]:
    """The job's ratio (with kills / without) and, where any kill landed, the cost of one kill."""
    job = Spread.of([sum(b.round_s) / sum(a.round_s) for a, b in pairs])
    costs = [(sum(b.round_s) - sum(a.round_s)) / b.kills for a, b in pairs if b.kills]
    unhurt = statistics.median(s for a, _ in pairs for s in a.round_s)
    kills = [b.kills for _, b in pairs]
    restarts = [b.restarts for _, b in pairs]
    rows = [
        Row(
            f"job with {'an' if role == 'actor' else 'a'} {role} kill every {kill_every} rounds (rounds 2..N)",
            f"{statistics.median(sum(b.round_s) for _, b in pairs):.1f} s",
            f"{statistics.median(sum(a.round_s) for a, _ in pairs):.1f} s without kills",
            job.median,
            f"{len(pairs)} A/B pairs, ratio {job.lo:.2f}-{job.hi:.2f}; kills per run {kills}, restarts seen {restarts}",
        )
    ]
    if costs:  # no kill landed (the job was too short for one): no cost to report
        per_kill = Spread.of(costs)
        rows.append(
            Row(
                f"cost of one {role} kill",
                f"{per_kill.median:.2f} s",
                f"{unhurt:.2f} s per unhurt round",
                per_kill.median / unhurt,
                f"(B - A) / kills per pair: {per_kill.lo:.2f}-{per_kill.hi:.2f} s",
            )
        )
    return rows


def main(
    env: str = typer.Option("CartPole-v1", help="the environment"),
    rounds: int = typer.Option(31, min=4, help="rounds per job"),
    kill_every: int = typer.Option(5, min=2, help="one kill in every this many rounds (side B)"),
    pairs: int = typer.Option(3, min=1, help="A/B pairs (A: no kills, B: kills)"),
    role: str = typer.Option("learner", help="whose instances are killed: learner, parameter or actor"),
    standby: int = typer.Option(0, min=0, help="warm spare learner and parameter instances (both sides)"),
    learners: int = typer.Option(2, min=1, help="the job's learners"),
    json_path: Path | None = typer.Option(None, "--json", help="also write the rows here, as a JSON list"),
) -> None:
    if role not in MARKERS:
        raise typer.BadParameter(f"--role must be one of {', '.join(MARKERS)}, got {role!r}")
    console = Console()
    done: list[tuple[Run, Run]] = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for i in range(pairs):
            seed = 1 + i
            a, b = (
                run_job(env, rounds, seed, Path(tmp), role=role, kill_every=kills, learners=learners, standby=standby)
                for kills in (None, kill_every)
            )
            console.print(
                f"pair {i + 1}: A {sum(a.round_s):.1f} s, B {sum(b.round_s):.1f} s with {b.kills} kills "
                f"({b.restarts} restarts seen)"
            )
            done.append((a, b))
    rows = rows_of(done, role, kill_every)
    table = Table("benchmark", "ours", "baseline", "ratio", "note")
    for r in rows:
        table.add_row(r.benchmark, r.ours, r.baseline, f"{r.ratio:.2f}", r.note)
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    typer.run(main)
