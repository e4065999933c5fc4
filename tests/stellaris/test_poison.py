"""Poisoned entries injected into a running `stellaris train` job (real CLI, given Redis, local gateway, subprocess
instances) are dead-lettered wherever they are read, and the job goes on: an undecodable trajectory batch and a
header-only one (its arrays missing) are given up on by the control plane's claim, an undecodable task by the learner
that claims it, and gradients with a base version never published (10**9), NaN values or the wrong shape by the
parameter function. The job exits 0, every task of every round is applied exactly once (gradients.csv: a poisoned
batch costs only itself, not its round's tasks), and info.csv counts each dead letter."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from cache import GradientMeta, GradientRecord, JobCache, TrajectoryBatch
from contract.codec import HEADER_FIELD, decode
from contract.packed import PACKED
from contract.records import TRAJECTORY_ARRAYS
from tests.stellaris.test_train import check_each_task_applied_once, read_on, rows, start_until_round, train_cmd

ROUNDS = 20


def _await_round(lines: list[str], proc: subprocess.Popen[str], k: int) -> None:
    """Until the job logs round `k` (the reader thread appends its lines), or ends."""
    deadline = time.monotonic() + 180
    while not any(line.startswith(f"round {k} ") for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"round {k} was not logged; the output ends:\n{''.join(lines)[-3000:]}")
        time.sleep(0.02)


def _xadd(client: redis.Redis, key: str, flat: list[bytes | memoryview]) -> str:
    pairs = {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}
    raw = client.xadd(key, pairs)  # type: ignore[arg-type]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _header_only(version: int) -> list[bytes | memoryview]:
    """A CartPole batch's header, naming its 7 arrays, without them (as if the payload were lost on the way)."""
    arrays = {k: np.zeros((128, 2, 4) if k == "observations" else (128, 2), np.float32) for k in TRAJECTORY_ARRAYS}
    return TrajectoryBatch("actor-0", version, 256, arrays, {"episode_returns": [500.0]}).fields()[:2]


def _gradient(task: str, base: int, params: np.ndarray) -> list[bytes | memoryview]:
    return GradientRecord(GradientMeta("learner-poison", base, task, 1, {}), {PACKED: params}).fields()


def test_poisoned_entries_are_dead_lettered_wherever_they_are_read_and_the_job_completes(
    redis_server, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc = start_until_round(
        train_cmd(tmp_path, "--rounds", str(ROUNDS), "--out", str(out), "--redis-url", redis_server.url), 2
    )
    lines, reader = read_on(proc)
    poisons = 0
    try:
        job = JobCache(redis.Redis.from_url(redis_server.url), json.loads((out / "state.json").read_text())["job"])
        k, client = job.keys, job.client
        version = int(client.get(k.policy_version) or 0)
        # Round 3 on: the control plane claims an undecodable trajectory entry and a header-only batch.
        _xadd(client, k.traj, [HEADER_FIELD, b"\xc1 not a header"])
        _xadd(client, k.traj, _header_only(version))
        poisons += 2
        _await_round(lines, proc, 5)
        # A task nobody can decode: the learner that claims it gives it up.
        _xadd(client, k.tasks, [HEADER_FIELD, b"\xc1 not a task"])
        poisons += 1
        _await_round(lines, proc, 8)
        # Gradients: a base version never published, NaN values, the wrong shape.
        size = decode(job.policies.latest()[1]).arrays[PACKED].size
        version = int(client.get(k.policy_version) or 0)
        nan = np.zeros(size, np.float32)
        nan[size // 3] = np.nan
        _xadd(client, k.grad, _gradient("poison-ahead", 10**9, np.zeros(size, np.float32)))
        _xadd(client, k.grad, _gradient("poison-nan", version, nan))
        _xadd(client, k.grad, _gradient("poison-shape", version, np.zeros(size + 1, np.float32)))
        poisons += 3
        deadline = time.monotonic() + 120  # read while the job runs: its keys go when it ends
        while len(letters := [(f["kind"], f["reason"]) for _, f in job.dead_letters.read()]) < poisons:
            assert proc.poll() is None and time.monotonic() < deadline, (letters, "".join(lines)[-3000:])
            time.sleep(0.05)
        assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert "Traceback" not in text, text[-3000:]
    assert sorted(kind for kind, _ in letters) == ["gradient"] * 3 + ["task"] + ["trajectory"] * 2, letters
    reasons = " | ".join(reason for _, reason in letters)
    assert "corrupt header" in reasons and "field a0 is missing" in reasons, reasons
    assert "base version 1000000000 is ahead of the newest published policy version" in reasons, reasons
    assert "non-finite values in params" in reasons and "does not fit" in reasons, reasons
    info = rows(out / "info.csv")
    assert [int(r["round_id"]) for r in info] == list(range(1, ROUNDS + 1))
    assert sum(int(r["dead_lettered"]) for r in info) == poisons  # and nothing else was given up on
    check_each_task_applied_once(out, ROUNDS)  # 16 tasks a round, each applied once: the poisons cost no task
