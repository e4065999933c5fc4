"""The two distribution profiles side by side (docs/workflows.md): bytes moved through Redis per env
step and env steps/s, for `distribution: trajectories` (actors ship trajectory batches to learner functions) and
`gradients_at_actors` (actors compute the gradients and ship only those).

Each run is one `stellaris train` subprocess with a redis-server of its own (started here, passed as --redis-url),
so nothing else counts in its INFO stats: bytes moved = the delta of total_net_input_bytes + total_net_output_bytes
over the run (every client: actors, learners, parameter function, gateway, control plane), divided by the run's env
steps. Env steps/s is over the rounds after the first (info.csv's round durations; round 1 holds the instances'
first loads). Profiles alternate (A B A B) so drift in the machine's load hits both alike; the table gives the median
over the pairs and the range.

    python -m experiments.profiles --hopper-pairs 3 --atari-pairs 1
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis
import typer

from cache.server import EmbeddedRedis

PROFILES = ("trajectories", "gradients_at_actors")


@dataclass(frozen=True)
class Setting:
    name: str
    args: tuple[str, ...]


HOPPER = Setting("Hopper-v5", ("--env", "Hopper-v5", "--preset", "fast"))
# The paper preset's Atari round: 256 env steps, 4 minibatches x 10 epochs, the Table II conv net.
ATARI = Setting("ALE/Pong-v5", ("--env", "ALE/Pong-v5", "--preset", "paper"))


@dataclass(frozen=True)
class Measured:
    profile: str
    env_steps: int
    bytes_moved: int
    steps_per_s: float

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_moved / max(self.env_steps, 1)


def net_bytes(client: redis.Redis) -> int:
    stats = client.info("stats")
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def run_once(setting: Setting, profile: str, rounds: int, out: Path, seed: int) -> Measured:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        before = net_bytes(client)
        cmd = [
            sys.executable,
            "-m",
            "stellaris.cli",
            "train",
            *setting.args,
            "--rounds",
            str(rounds),
            "--distribution",
            profile,
            "--seed",
            str(seed),
            "--redis-url",
            server.url,
            "--out",
            str(out),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        moved = net_bytes(client) - before
        client.close()
    rows = list(csv.DictReader((out / "info.csv").open()))
    steady = rows[1:] or rows
    steps = int(rows[-1]["env_steps"]) - (int(rows[0]["env_steps"]) if len(rows) > 1 else 0)
    return Measured(profile, int(rows[-1]["env_steps"]), moved, steps / sum(float(r["duration"]) for r in steady))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def table(name: str, results: list[Measured]) -> str:
    lines = [f"| {name} | profile | runs | bytes/env step, median (range) | env steps/s, median (range) |"]
    lines.append("|---|---|---|---|---|")
    for profile in PROFILES:
        mine = [r for r in results if r.profile == profile]
        if mine:
            per_step = spread([r.bytes_per_step for r in mine])
            rate = spread([r.steps_per_s for r in mine])
            lines.append(f"| {name} | {profile} | {len(mine)} | {per_step} | {rate} |")
    return "\n".join(lines)


def main(
    hopper_pairs: int = typer.Option(3, min=0, help="A B pairs on Hopper-v5"),
    atari_pairs: int = typer.Option(1, min=0, help="A B pairs on ALE/Pong-v5"),
    hopper_rounds: int = typer.Option(4, min=2, help="rounds per Hopper run (fast preset: 2,048 env steps each)"),
    atari_rounds: int = typer.Option(4, min=2, help="rounds per Atari run (paper preset: 256 env steps each)"),
    seed: int = typer.Option(0),
    out: Path | None = typer.Option(None, help="where the runs go (default: a temporary directory)"),
) -> None:
    root = out or Path(tempfile.mkdtemp(prefix="profiles-"))
    for setting, pairs, rounds in ((HOPPER, hopper_pairs, hopper_rounds), (ATARI, atari_pairs, atari_rounds)):
        results: list[Measured] = []
        for pair in range(pairs):
            for profile in PROFILES:
                run_dir = root / f"{setting.name.replace('/', '-')}-{profile}-{pair}"
                m = run_once(setting, profile, rounds, run_dir, seed)
                results.append(m)
                print(
                    f"{setting.name} {profile} pair {pair}: {m.env_steps} env steps, {m.bytes_moved:,} bytes, "
                    f"{m.bytes_per_step:,.0f} bytes/step, {m.steps_per_s:,.0f} env steps/s",
                    flush=True,
                )
        if results:
            print(table(setting.name, results), flush=True)


if __name__ == "__main__":
    typer.run(main)
