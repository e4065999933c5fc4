"""Cache throughput: our codec + streams vs pickle + Redis (the original Stellaris path) vs raw SET/GET.

Payloads: (a) a Hopper PPO batch of 4096 steps, (b) a gradient of the 2x256 actor + critic MLP (the paper preset's),
(c) one of the 2x64 MLP (the fast preset's). Each path does
put + get round trips of the same payload against the same Redis server in one run; the table reports round
trips/s and MB/s (median of `--repeats`) and the ratios ours/pickle and ours/raw. For the gradient, "ours (learner
claim)" is a learner's steady step instead: one claim that stores the finished task's gradient (packed in one
buffer) with its ack and takes the next task with the current weights (`TaskBoard.claim`), the round trip every
gradient makes whatever the computation beside it.

    python -m experiments.bench_cache [--seconds 1.0] [--repeats 5] [--csv out.csv]
"""

from __future__ import annotations

import csv
import pickle
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import typer
from rich.console import Console
from rich.table import Table
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from cache import Cache, GradientMeta, GradientRecord, JobCache, JobLimits, LearnerTask, TrajectoryBatch, connect
from contract.codec import decode, encode

HOPPER_OBS, HOPPER_ACT, STEPS = 11, 3, 4096


def hopper_batch(steps: int = STEPS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    f32 = np.float32
    return {
        "observations": rng.standard_normal((steps, HOPPER_OBS)).astype(f32),
        "actions": rng.standard_normal((steps, HOPPER_ACT)).astype(f32),
        "rewards": rng.standard_normal(steps).astype(f32),
        "terminations": rng.random(steps) < 0.01,
        "truncations": np.zeros(steps, bool),
        "behaviour_log_probs": rng.standard_normal(steps).astype(f32),
        "values": rng.standard_normal(steps).astype(f32),
    }


def mlp_gradient(hidden: int = 256) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)

    def mlp(out: int) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(HOPPER_OBS, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, out),
        )

    grads = {f"actor.{n}": torch.randn_like(p) for n, p in mlp(HOPPER_ACT).named_parameters()}
    grads["actor.log_std"] = torch.zeros(HOPPER_ACT)
    grads |= {f"critic.{n}": torch.randn_like(p) for n, p in mlp(1).named_parameters()}
    return grads


def payloads() -> tuple[tuple[str, dict[str, Any]], ...]:
    return ("batch", hopper_batch()), ("grad", mlp_gradient()), ("grad64", mlp_gradient(64))


LABELS = {"batch": "Hopper batch 4096 steps", "grad": "2x256 MLP gradient", "grad64": "2x64 MLP gradient"}


@dataclass
class Result:
    payload: str
    path: str
    bytes_per_trip: int
    trips_per_s: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_per_trip * self.trips_per_s / 1e6


def rate(fn: Callable[[], Any], seconds: float, repeats: int) -> float:
    """Median round trips per second over `repeats` timed windows of about `seconds` each."""
    for _ in range(3):
        fn()  # warm up connections and allocators
    rates = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            fn()
            n += 1
        rates.append(n / elapsed)
    return statistics.median(rates)


def claim_step(job: JobCache, arrays: dict[str, Any], block: int = 128) -> Callable[[], None]:
    """A learner's steady step (`TaskBoard.claim` storing the last task's gradient), with the gradient packed in one
    buffer as a learner's policy packs it (`params`). The weights (a policy of the same size) come back with every
    claim, as they do in a run where the parameter function publishes between two claims. Every `block` steps the
    stored gradients are deleted and `block` more tasks enqueued, as the parameter function and the control plane
    would: two more round trips per block, inside the timed window."""
    packed = {"params": torch.cat([torch.as_tensor(a).flatten() for a in arrays.values()])}
    grad = GradientRecord(GradientMeta("bench-learner", 0, "0-1", 1), packed)
    board = job.board
    job.policies.initialise(encode(packed))
    finished: list[tuple[str, GradientRecord]] = []

    def step() -> None:
        claim = board.claim("bench-learner", finished=finished.pop() if finished else None)
        if claim.task is None:
            job.client.delete(job.gradients.key)
            board.enqueue([LearnerTask(1, ("0-1",), 0, i, block) for i in range(block)], close_round=None, timeout_s=5)
            return
        finished.append((claim.task.id, grad))

    return step


def paths_for(job: JobCache, name: str, arrays: dict[str, Any]) -> dict[str, tuple[Callable[[], Any], int]]:
    client = job.client
    key = f"{job.keys.base}:bench:{name}"
    if name == "batch":
        record = TrajectoryBatch("bench-actor", 0, STEPS, arrays)
        queue = job.trajectories

        def ours() -> None:  # push, a consumer's read with the arrays decoded, ack
            queue.put(record)
            [entry] = queue.stream.read("bench")
            TrajectoryBatch.from_fields(entry.fields)
            queue.ack([entry.id])

    else:  # either gradient
        grad = GradientRecord(GradientMeta("bench-learner", 0, "0-1", 1), arrays)
        gqueue = job.gradients

        def ours() -> None:  # push, the parameter function's read with the tensors decoded, delete
            gqueue.put(grad)
            [entry] = gqueue.read("0-0", count=1)
            gqueue.record(entry)
            client.xdel(gqueue.key, entry.id)

    def codec_set_get() -> None:
        client.set(key, encode(arrays))
        decode(client.get(key)).tensors() if name != "batch" else decode(client.get(key))

    np_arrays = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in arrays.items()}

    def safetensors_set_get() -> None:
        client.set(key, st_save(np_arrays))
        st_load(client.get(key))

    def pickle_path() -> None:
        client.set(key, pickle.dumps(arrays))
        pickle.loads(client.get(key))

    raw = encode(arrays)

    def raw_path() -> None:
        client.set(key, raw)
        client.get(key)

    size = len(raw)
    claim = {} if name == "batch" else {"ours (learner claim)": (claim_step(job, arrays), size)}
    return {
        "ours (stream)": (ours, size),
        **claim,
        "ours (codec SET/GET)": (codec_set_get, size),
        "safetensors SET/GET": (safetensors_set_get, len(st_save(np_arrays))),
        "pickle + Redis": (pickle_path, len(pickle.dumps(arrays))),
        "raw SET/GET": (raw_path, size),
    }


def run(cache: Cache, seconds: float, repeats: int, console: Console) -> list[Result]:
    results: list[Result] = []
    for name, arrays in payloads():
        # A job per payload: a job's policy is stored once, and the claim path's weights must be its payload's size.
        job = JobCache(cache.client, f"bench-{uuid.uuid4().hex[:8]}", JobLimits())
        try:
            for path, (fn, size) in paths_for(job, name, arrays).items():
                console.log(f"{name}: {path}")
                results.append(Result(name, path, size, rate(fn, seconds, repeats)))
        finally:
            job.delete()
    return results


def render(results: list[Result], console: Console) -> None:
    table = Table(title="Cache put+get round trips (median of repeats, same Redis, same run)")
    for col in ("payload", "path", "bytes", "trips/s", "MB/s", "vs pickle", "vs raw"):
        table.add_column(col, justify="right" if col not in ("payload", "path") else "left")
    for payload, label in LABELS.items():
        rows = {r.path: r for r in results if r.payload == payload}
        pickle_rate, raw_rate = rows["pickle + Redis"].trips_per_s, rows["raw SET/GET"].trips_per_s
        for r in rows.values():
            table.add_row(
                label,
                r.path,
                f"{r.bytes_per_trip:,}",
                f"{r.trips_per_s:,.0f}",
                f"{r.mb_per_s:,.0f}",
                f"{r.trips_per_s / pickle_rate:.2f}x",
                f"{r.trips_per_s / raw_rate:.2f}x",
            )
    console.print(table)
    console.print("Targets: ours >= 2x the pickle path and >= 0.8x raw bytes.")


def main(
    seconds: float = typer.Option(1.0, help="length of one timed window"),
    repeats: int = typer.Option(5, help="timed windows per path; the median is reported"),
    csv_path: Path | None = typer.Option(None, "--csv", help="also write the results here"),
) -> None:
    console = Console()
    with connect() as cache:
        results = run(cache, seconds, repeats, console)
    render(results, console)
    if csv_path is not None:
        with csv_path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["payload", "path", "bytes", "trips_per_s", "mb_per_s"])
            for r in results:
                w.writerow([r.payload, r.path, r.bytes_per_trip, f"{r.trips_per_s:.1f}", f"{r.mb_per_s:.1f}"])


if __name__ == "__main__":
    typer.run(main)
