"""actor -> learner -> parameter handlers against a real Redis, with concurrent learner and parameter processes."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache import Cache, JobCache
from functions.algos.config import NetworkConfig, PPOConfig, StellarisConfig
from functions.algos.staleness import Rule
from functions.handlers import parameter
from functions.jobspec import JobSpec
from tests.functions.driver import Driver
from tests.functions.workers import stop_key

ROOT = Path(__file__).resolve().parents[2]


def small_spec(job: str, rule: Rule = Rule.STELLARIS) -> JobSpec:
    cfg = PPOConfig(
        lr=1e-3, train_batch_size=256, num_minibatches=4, num_epochs=2, clip=0.2, kl_coef=0.0, ent_coef=0.01,
        network=NetworkConfig(kind="mlp", hidden=(32, 32)), stellaris=StellarisConfig(rule=rule),
    )  # fmt: skip
    return JobSpec(job=job, env_id="CartPole-v1", algo=cfg, num_envs=2, actor_steps=64, seed=3)


def spawn(role: str, url: str, job: str, n: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.functions.workers", role, url, job, f"{role}-{i}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def stop(job: JobCache, procs: list[subprocess.Popen[str]]) -> list[dict]:
    job.client.set(stop_key(job.keys.job), 1, ex=600)
    lines = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        lines += [json.loads(line) for line in out.splitlines()]
    return lines


@pytest.fixture
def cleanup(cache_conn: Cache) -> Iterator[list[JobCache]]:
    jobs: list[JobCache] = []
    yield jobs
    for j in jobs:
        j.delete()


def test_rounds_with_two_concurrent_learner_processes(redis_server, cache_conn: Cache, job_id: str, cleanup) -> None:
    driver = Driver(cache_conn, small_spec(job_id), actors=2)
    job = driver.job
    cleanup.append(job)
    learners = spawn("learner", redis_server.url, job_id, 2)
    try:
        rounds = 4
        for _ in range(rounds):
            driver.run_round(mode="stellaris", learn_inline=False)
    finally:
        done = stop(job, learners)

    tasks_per_round = 2 * 4
    assert len(done) == rounds * tasks_per_round  # every task computed exactly once
    assert {d["status"] for d in done} == {"done"}
    applied = [d for d in driver.decisions if d["applied"]]
    assert job.policies.version() == len(applied)  # one published version per aggregation
    assert sum(d["count"] for d in applied) == rounds * tasks_per_round  # every gradient aggregated once
    # Everything was acknowledged and released.
    assert job.tasks.length() == 0 and job.tasks.pending() == 0
    assert job.gradients.stream.length() == 0
    assert job.trajectories.stream.length() == 0
    assert job.learners.in_flight() == {}
    # Staleness accounting: recorded stalenesses are current version - base version, δ_max is round 1's max.
    for d in applied:
        assert all(s >= 0 for s in d["stalenesses"])
    round1 = [s for d in applied if d["round"] == 1 for s in d["stalenesses"][: d["count"]]]
    state = job.client.hgetall(job.keys.aggregator)
    assert float(state[b"delta_max"]) == max(round1)
    assert int(float(state[b"round_k"])) == rounds
    assert job.client.xlen(job.keys.decisions) == len(driver.decisions)


def test_sync_mode_applies_one_update_per_epoch_with_zero_staleness(redis_server, cache_conn, job_id, cleanup) -> None:
    driver = Driver(cache_conn, small_spec(job_id, Rule.SYNC), actors=1)
    cleanup.append(driver.job)
    learners = spawn("learner", redis_server.url, job_id, 2)
    try:
        for _ in range(2):
            driver.run_round(mode="sync", learn_inline=False)
    finally:
        stop(driver.job, learners)
    applied = [d for d in driver.decisions if d["applied"]]
    assert [d["count"] for d in applied] == [4] * 4  # 2 rounds x 2 epochs, all 4 minibatches averaged
    assert all(s == 0 for d in applied for s in d["stalenesses"])
    assert driver.job.policies.version() == 4


def test_racing_parameter_invocations_never_publish_twice(redis_server, cache_conn, job_id, cleanup) -> None:
    driver = Driver(cache_conn, small_spec(job_id, Rule.ASYNC), actors=1)
    job = driver.job
    cleanup.append(job)
    driver.round = 1
    batch_ids = driver.collect()
    job.enqueue_tasks(driver.tasks(batch_ids, range(2)))
    for _ in range(8):
        assert driver.learner({"job": job_id})["status"] == "done"
    assert job.gradients.stream.length() == 8

    racers = spawn("parameter", redis_server.url, job_id, 4)
    # Wait for the queue to drain: each publish acks its gradient; block on the version events, not a timer.
    seen, deadline = 0, time.monotonic() + 60
    while seen < 8 and time.monotonic() < deadline:
        seen = job.policies.wait_for_version(seen, timeout_s=5) or seen
    published = stop(job, racers)
    versions = [d["version"] for out in published for d in out["decisions"] if d["applied"]]
    assert sorted(v + 1 for v in versions) == list(range(1, 9))  # each version published by exactly one racer
    assert job.policies.version() == 8
    assert job.gradients.queued(parameter.CONSUMER) == []


def test_handlers_run_unchanged_behind_the_http_runtime(redis_server, cache_conn, job_id, cleanup) -> None:
    import os

    import httpx

    driver = Driver(cache_conn, small_spec(job_id))
    cleanup.append(driver.job)
    driver.round = 1
    driver.job.enqueue_tasks(driver.tasks(driver.collect(), range(1)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "functions.runtime", "--handler", "functions.handlers.learner:handle"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "REDIS_URL": redis_server.url},
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            out = client.post("/invoke", json={"job": job_id}, headers={"X-Call-Id": "abc"})
            assert out.status_code == 200, out.text
            assert out.json()["status"] == "done" and out.json()["base_version"] == 0
            bad = client.post("/invoke", json={"nojob": 1})
            assert bad.status_code == 500 and bad.json()["error"]["type"] == "EventError"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert driver.job.gradients.stream.length() == 1
