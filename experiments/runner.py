"""Run a suite's training runs: each one a `stellaris train` subprocess against one shared deployment (an embedded
Redis and a local gateway, or the URLs given), up to `parallel` at a time. A finished run is never redone; an
interrupted one resumes from its checkpoint."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from cache.connection import redact_url
from experiments.suites import RunPlan
from host.lifetime import dies_with_us


@dataclass(frozen=True)
class Deployment:
    redis_url: str
    gateway_url: str
    gateway_token: str | None


@dataclass
class Outcome:
    plan: RunPlan
    status: str  # "done", "skipped" (finished before), "failed", "interrupted"
    seconds: float = 0.0
    detail: str = ""


def run_dir(root: Path, plan: RunPlan) -> Path:
    return root / "runs" / plan.run_id


def rounds_done(path: Path) -> int:
    state = path / "state.json"
    if not state.exists():
        return 0
    try:
        return int(json.loads(state.read_text()).get("round", 0))
    except (ValueError, OSError):
        return 0


def is_finished(root: Path, plan: RunPlan) -> bool:
    return rounds_done(run_dir(root, plan)) >= plan.rounds


def _command(path: Path, plan: RunPlan, deployment: Deployment) -> list[str]:
    cmd = [sys.executable, "-m", "stellaris.cli", "train"]
    if rounds_done(path) > 0:
        cmd += ["--resume", str(path)]
    else:
        if path.exists():  # started but never checkpointed a round: nothing worth keeping
            shutil.rmtree(path)
        path.mkdir(parents=True)
        (path / "plan.yaml").write_text(yaml.safe_dump(plan.config, sort_keys=True))
        cmd += ["--config", str(path / "plan.yaml"), "--out", str(path)]
    cmd += ["--redis-url", deployment.redis_url, "--gateway-url", deployment.gateway_url]
    if deployment.gateway_token:
        cmd += ["--gateway-token", deployment.gateway_token]
    return cmd


def _redacted(cmd: list[str]) -> list[str]:
    """The command as logged: no gateway token or Redis password in log files."""
    out = []
    for i, arg in enumerate(cmd):
        if i and cmd[i - 1] == "--gateway-token":
            arg = "***"
        elif i and cmd[i - 1] == "--redis-url":
            arg = redact_url(arg)
        out.append(arg)
    return out


def execute(
    root: Path,
    plans: list[RunPlan],
    deployment: Deployment,
    *,
    parallel: int,
    on_outcome: Callable[[Outcome], None],
) -> list[Outcome]:
    """Run every unfinished plan (distinct run ids once), `parallel` at a time; each run's output goes to log.txt in
    its directory. On Ctrl-C or SIGTERM the running ones are stopped at a checkpoint and no new one starts."""
    stop = threading.Event()
    unique = list({p.run_id: p for p in plans}.values())
    running: set[subprocess.Popen[bytes]] = set()
    lock = threading.Lock()

    def one(plan: RunPlan) -> Outcome:
        path = run_dir(root, plan)
        if is_finished(root, plan):
            return Outcome(plan, "skipped")
        if stop.is_set():
            return Outcome(plan, "interrupted", detail="not started")
        cmd = _command(path, plan, deployment)
        t0 = time.monotonic()
        with (path / "log.txt").open("a") as log:
            log.write(f"$ {' '.join(_redacted(cmd))}\n")
            log.flush()
            with lock:
                if stop.is_set():
                    return Outcome(plan, "interrupted", detail="not started")
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_us())
                running.add(proc)
            code = proc.wait()
            with lock:
                running.discard(proc)
        seconds = time.monotonic() - t0
        if code == 0 and is_finished(root, plan):
            return Outcome(plan, "done", seconds)
        if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
            stop.set()
            return Outcome(plan, "interrupted", seconds, "interrupted; run the suite again to resume")
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-3:]
        return Outcome(plan, "failed", seconds, f"exit code {code}: {' | '.join(tail)}")

    def tracked(plan: RunPlan) -> Outcome:
        outcome = one(plan)
        on_outcome(outcome)
        return outcome

    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="run")
    futures = [pool.submit(tracked, plan) for plan in unique]
    try:
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM turned into SystemExit: runs stop at a checkpoint, queued ones never start
        with lock:
            stop.set()
            for proc in running:
                # Runs live in their own sessions (no terminal's Ctrl-C reaches them), and a background shell may
                # have them ignore SIGINT: SIGTERM, which `stellaris train` turns into a clean stop, always works.
                proc.send_signal(signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
