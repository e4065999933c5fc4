"""Serverful actors forked from their own fork server (stellaris/platform/serverful_actors.py), against a real job:
they collect, a kill -9 of one is restarted as a fork of the same server, a kill -9 of the server takes its actors
along and a new server forks them again, a scale-down's SIGTERM is obeyed with exit 0, and closing stops the server.
Without forks, each is a fresh interpreter, as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cache import Cache, JobCache
from gateway.backends.process.tree import wait_gone
from gateway.backends.process.zygote import ForkedProcess
from stellaris.platform.calls import TrainingError
from stellaris.platform.serverful_actors import ACTOR_FORK_ENV, ServerfulActors, fork_from_env
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec


def _env(cache: Cache, job_id: str) -> dict[str, str]:
    return {"REDIS_URL": cache.url, "STELLARIS_JOB": job_id, "STELLARIS_DEVICE": "cpu"}


def _batches_from(job: JobCache, actor_ids: set[str]) -> set[str]:
    """Take batches until one of each of `actor_ids` came; the ids seen."""
    seen: set[str] = set()
    while not actor_ids <= seen:
        got = job.trajectories.take("test", count=8, block_s=60)
        assert got, f"no batch within 60 s; seen {sorted(seen)}"
        seen |= {b.actor_id for _, b in got}
    return seen


def _publish_next(job: JobCache) -> None:
    lease = job.policies.acquire("test")
    version = job.policies.version() or 0
    job.policies.publish(lease, expected_version=version, weights=job.policies.get(version))
    job.policies.release(lease)


def test_forked_actors_collect_restart_scale_and_stop(cache_conn: Cache, job_id: str) -> None:
    job = Driver(cache_conn, small_spec(job_id)).job
    actors = ServerfulActors(job_id, 1, lambda: _env(cache_conn, job_id))
    try:
        actors.start_soon()
        actors.start(2)
        assert actors.forks is not None and actors.forks._proc is not None
        server = actors.forks._proc.pid
        for i, proc in enumerate(actors.procs):
            assert isinstance(proc, ForkedProcess)
            assert Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].split()[1] == str(server)  # its ppid
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
            assert cmdline == f"{sys.executable} -m functions.actor.loop {job_id} actor-{i} {i} 1"
        assert _batches_from(job, {"actor-0", "actor-1"}) == {"actor-0", "actor-1"}

        dead = actors.procs[0]
        os.kill(dead.pid, signal.SIGKILL)
        assert dead.wait(timeout=10) == -signal.SIGKILL
        assert actors.restart_dead() == 1
        assert actors.deaths == {"actor-0": 1}
        reborn = actors.procs[0]
        assert isinstance(reborn, ForkedProcess) and reborn.pid != dead.pid
        _publish_next(job)
        _batches_from(job, {"actor-0"})  # the restarted actor collects
        actors.landed({"actor-0"})
        assert actors.deaths == {}

        surplus = actors.procs[1]
        assert actors.scale(1) == (0, 1)
        _publish_next(job)  # the actor obeys SIGTERM between batches
        assert surplus.wait(timeout=60) == 0
    finally:
        actors.close()
        job.delete()
    assert not wait_gone({server, *(p.pid for p in (dead, reborn, surplus))}, timeout_s=10)


def test_a_killed_fork_server_takes_its_actors_and_a_new_one_forks_them_again(cache_conn: Cache, job_id: str) -> None:
    job = Driver(cache_conn, small_spec(job_id)).job
    actors = ServerfulActors(job_id, 1, lambda: _env(cache_conn, job_id))
    try:
        actors.start(2)
        assert actors.forks is not None and actors.forks._proc is not None
        server, before = actors.forks._proc.pid, list(actors.procs)
        os.kill(server, signal.SIGKILL)
        assert [p.wait(timeout=10) for p in before] == [-signal.SIGKILL] * 2  # they die with it
        assert actors.restart_dead() == 2 and actors.deaths == {"actor-0": 1, "actor-1": 1}
        assert actors.forks._proc is not None and actors.forks._proc.pid != server  # a new server
        assert all(isinstance(p, ForkedProcess) for p in actors.procs)
        _publish_next(job)
        assert _batches_from(job, {"actor-0", "actor-1"}) == {"actor-0", "actor-1"}  # and they collect again
    finally:
        actors.close()
        job.delete()


def test_without_forks_each_actor_is_a_fresh_interpreter(cache_conn: Cache, job_id: str) -> None:
    job = Driver(cache_conn, small_spec(job_id)).job
    actors = ServerfulActors(job_id, 1, lambda: _env(cache_conn, job_id), fork=False)
    try:
        actors.start(1)
        assert isinstance(actors.procs[0], subprocess.Popen)
        assert _batches_from(job, {"actor-0"}) == {"actor-0"}
    finally:
        actors.close()
        job.delete()


def test_the_fork_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, forks in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv(ACTOR_FORK_ENV, raw)
        assert fork_from_env() is forks
    monkeypatch.setenv(ACTOR_FORK_ENV, "no")
    with pytest.raises(TrainingError, match=r"STELLARIS_ACTOR_FORK_SERVER must be 1 .* or 0: 'no'"):
        fork_from_env()
