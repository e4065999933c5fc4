"""The service times behind deploy/README.md's "Scale on paper": what one call costs the gateway and Redis, and
what one applied gradient costs Redis, measured as CPU seconds of the serving process (not wall time, which on a
shared machine mostly measures the neighbours).

- calls: a real gateway (`python -m gateway`, process backend) and a warm no-op function on a private Redis,
  driven at concurrency 32 by experiments.bench_gateway's load generator; per window, the gateway process's and
  redis-server's CPU seconds divided by the calls served.
- job: a real short training run (`stellaris train`, Hopper-v5, `--preset`, process backend) on a private Redis;
  per applied gradient (gradients.csv), redis-server's CPU seconds, commands and bytes in and out, and per
  invocation (invocations.csv) likewise.

Medians over windows (calls) and one figure per run (job); run it several times for the spread.

    python deploy/measure_scale.py [--windows 5] [--seconds 3] [--rounds 12] [--preset fast|paper] [--skip-job]
"""

from __future__ import annotations

import asyncio
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis
import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the project's packages come from this checkout

from cache import JobCache, JobLimits  # noqa: E402
from cache.server import EmbeddedRedis  # noqa: E402
from experiments.bench_cache import hopper_batch, mlp_gradient, paths_for  # noqa: E402
from experiments.bench_gateway import TOKEN, drive, start_gateway  # noqa: E402
from gateway.client import GatewayClient  # noqa: E402
from gateway.models import FunctionSpec  # noqa: E402


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure_calls(windows: int, seconds: float) -> dict[str, float]:
    """Gateway and Redis CPU milliseconds per warm no-op call through the gateway, at concurrency 32."""
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        proc, gw_url = start_gateway(server.url)
        try:
            spec = FunctionSpec(
                name="noop",
                target="experiments.noop:handle",
                min_warm=1,
                max_instances=1,
                concurrency_per_instance=64,
                max_concurrency=64,
                env={"STELLARIS_LOG_LEVEL": "WARNING"},
            )
            with GatewayClient(gw_url, token=TOKEN) as gw:
                gw.register(spec)
            url, headers = f"{gw_url}/function/noop", {"Authorization": f"Bearer {TOKEN}"}
            gateway_ms, redis_ms, rates = [], [], []
            for _ in range(windows):
                g0, r0 = process_cpu_s(proc.pid), redis_cpu_s(client)
                window = asyncio.run(drive(url, headers, 32, seconds))
                calls = len(window.latencies_s)
                gateway_ms.append((process_cpu_s(proc.pid) - g0) / calls * 1e3)
                redis_ms.append((redis_cpu_s(client) - r0) / calls * 1e3)
                rates.append(window.rate)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {
        "gateway_cpu_ms_per_call": statistics.median(gateway_ms),
        "redis_cpu_ms_per_call": statistics.median(redis_ms),
        "calls_per_s_c32": statistics.median(rates),
    }


def measure_payloads(windows: int, seconds: float) -> dict[str, float]:
    """Redis CPU milliseconds per stream round trip of one payload (experiments.bench_cache's "ours (stream)": put,
    a consumer's read with the arrays decoded, ack or delete): a Hopper batch of 4,096 steps, and a gradient of the
    paper preset's 2x256 actor-critic MLP."""
    results: dict[str, float] = {}
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        job = JobCache(client, "scale-payloads", JobLimits())
        try:
            for name, arrays in (("batch4096", hopper_batch()), ("grad2x256", mlp_gradient())):
                trip, size = paths_for(job, "batch" if name == "batch4096" else "grad", arrays)["ours (stream)"]
                per_trip_ms = []
                for _ in range(windows):
                    r0, n, start = redis_cpu_s(client), 0, time.perf_counter()
                    while time.perf_counter() - start < seconds:
                        trip()
                        n += 1
                    per_trip_ms.append((redis_cpu_s(client) - r0) / n * 1e3)
                results[f"redis_cpu_ms_per_{name}_trip"] = statistics.median(per_trip_ms)
                results[f"{name}_bytes"] = size
        finally:
            job.delete()
    return results


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def measure_job(rounds: int, preset: str) -> dict[str, Any]:
    """Redis CPU, commands and bytes per applied gradient and per invocation of a real Hopper-v5 run."""
    with EmbeddedRedis() as server, tempfile.TemporaryDirectory(prefix="stl-scale-") as tmp:
        client = redis.Redis.from_url(server.url)
        client.config_resetstat()
        cpu0 = redis_cpu_s(client)
        out = Path(tmp) / "run"
        argv = [
            sys.executable,
            "-m",
            "stellaris.cli",
            "train",
            "--env",
            "Hopper-v5",
            "--preset",
            preset,
            "--rounds",
            str(rounds),
            "--seed",
            "1",
            "--out",
            str(out),
            "--redis-url",
            server.url,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        cpu_s = redis_cpu_s(client) - cpu0
        stats = client.info("stats")
        commandstats = client.info("commandstats")
        gradients = len(_rows(out / "gradients.csv"))
        invocations = _rows(out / "invocations.csv")
        rounds_info = _rows(out / "info.csv")
    calls = sum(int(v["calls"]) for v in commandstats.values())
    top = sorted(commandstats.items(), key=lambda kv: -float(kv[1]["usec"]))[:6]
    round_s = statistics.median(float(r["duration"]) for r in rounds_info[1:]) if len(rounds_info) > 1 else 0.0
    learner_s = sum(float(r["duration"]) for r in invocations if "learner" in r["function"])
    return {
        "rounds": len(rounds_info),
        "median_round_s": round_s,
        "gradients": gradients,
        "invocations": len(invocations),
        "redis_cpu_ms_per_gradient": cpu_s / gradients * 1e3,
        "redis_commands_per_gradient": calls / gradients,
        "redis_bytes_in_per_gradient": int(stats["total_net_input_bytes"]) / gradients,
        "redis_bytes_out_per_gradient": int(stats["total_net_output_bytes"]) / gradients,
        "client_round_trips_per_gradient": sum(int(r["redis_round_trips"]) for r in rounds_info) / gradients,
        "gradients_per_round": gradients / len(rounds_info),
        "gradients_per_learner_invocation_s": gradients / learner_s,
        "invocations_per_round": len(invocations) / len(rounds_info),
        "top_commands_usec_per_gradient": {name: float(s["usec"]) / gradients for name, s in top},
    }


def main(
    windows: int = typer.Option(5, help="timed windows of calls; the medians are reported"),
    seconds: float = typer.Option(3.0, help="length of one window of calls"),
    rounds: int = typer.Option(12, help="rounds of the Hopper-v5 run"),
    preset: str = typer.Option("fast", help="the run's preset: fast (64x64 MLP) or paper (2x256)"),
    skip_job: bool = typer.Option(False, "--skip-job", help="measure the calls only"),
) -> None:
    for name, value in (measure_calls(windows, seconds) | measure_payloads(windows, seconds / 3)).items():
        print(f"{name}: {value:.3f}")
    if not skip_job:
        for name, value in measure_job(rounds, preset).items():
            print(f"{name}: {value if isinstance(value, dict | int) else round(value, 3)}")


if __name__ == "__main__":
    typer.run(main)
