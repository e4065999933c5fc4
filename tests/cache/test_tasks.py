"""The learner task board against a real Redis: leases, take-over of a dead holder's task, exactly one stored gradient
per task, dead letters."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cache import Cache, GradientMeta, GradientRecord, JobCache, JobLimits, LearnerTask
from tests.procs import wait_pid_gone

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 0.6


@pytest.fixture
def board_job(cache_conn: Cache, job_id: str):
    job = JobCache(cache_conn.client, job_id, JobLimits(learner_lease_s=LEASE_S, max_attempts=2))
    job.policies.initialise(b"w0")
    yield job
    job.delete()


def tasks(n: int, round_k: int = 1) -> list[LearnerTask]:
    return [LearnerTask(round_k, ("0-1",), 0, i, n) for i in range(n)]


def gradient(learner: str, task_id: str, version: int = 0) -> GradientRecord:
    return GradientRecord(GradientMeta(learner, version, task_id, 1), {"w": torch.ones(2)})


def test_claim_then_store_with_the_next_claim(board_job: JobCache) -> None:
    board = board_job.board
    ids = board.enqueue(tasks(2), close_round=1, timeout_s=1)
    first = board.claim("a")
    assert first.task is not None and first.task.id == ids[0]
    assert first.version == 0 and first.held == {"a": 0} and first.outstanding == 2 and first.closed_round == 1
    assert first.weights == b"w0"  # the current version's weights come with the task
    second = board.claim("a", held_version=0, finished=(ids[0], gradient("a", ids[0])))
    assert second.stored is not None and not second.lost
    assert second.task is not None and second.task.id == ids[1] and second.weights is None  # already held
    assert second.outstanding == 1  # the first task left with its gradient
    last = board.claim("a", held_version=0, finished=(ids[1], gradient("a", ids[1])))
    assert last.task is None and last.outstanding == 0
    assert [board_job.gradients.meta(e).task_id for e in board_job.gradients.read()] == ids


def test_a_claim_whose_reply_was_lost_hands_the_same_task_out_again(board_job: JobCache) -> None:
    """A claim retried after a dropped connection (the first run's reply never arrived) returns the task that reply
    carried, not nothing: otherwise a live learner would hold a task it never works on, and the round would stall."""
    board = board_job.board
    ids = board.enqueue(tasks(2), close_round=1, timeout_s=1)
    lost = board.claim("a")  # its reply "lost": "a" never learns of this task
    again = board.claim("a")
    assert lost.task is not None and again.task is not None and again.task.id == lost.task.id == ids[0]
    [pending] = board_job.client.xpending_range(board_job.keys.tasks, board.GROUP, "-", "+", 10)
    assert pending["times_delivered"] == 1  # handed out again, not counted as another attempt
    nxt = board.claim("a", finished=(ids[0], gradient("a", ids[0])))
    assert nxt.stored is not None and nxt.task is not None and nxt.task.id == ids[1]


def test_a_learner_claiming_ahead_gets_a_new_task_while_it_holds_one_and_stores_each_gradient_once(
    board_job: JobCache,
) -> None:
    """Claiming ahead: the claim made while a task is computed (`holding` it) takes the next task, not the held one
    again (as it would for a lost reply), and stores the gradient before that; each task yields one gradient."""
    board = board_job.board
    ids = board.enqueue(tasks(3), close_round=1, timeout_s=1)
    first = board.claim("a")
    assert first.task is not None and first.task.id == ids[0]
    ahead = board.claim("a", held_version=0, holding=ids[0])  # computing ids[0]: the claim runs meanwhile
    assert ahead.task is not None and ahead.task.id == ids[1] and ahead.outstanding == 3
    again = board.claim("a", held_version=0, finished=(ids[0], gradient("a", ids[0])), holding=ids[1])
    assert again.stored is not None and again.task is not None and again.task.id == ids[2]
    # A lost reply while holding one: the other task of ours is handed out again, the held one never.
    retried = board.claim("a", held_version=0, holding=ids[1])
    assert retried.task is not None and retried.task.id == ids[2]
    for tid, holding in ((ids[1], ids[2]), (ids[2], None)):
        board.claim("a", held_version=0, finished=(tid, gradient("a", tid)), holding=holding)
    assert [board_job.gradients.meta(e).task_id for e in board_job.gradients.read()] == ids
    assert board.outstanding() == 0


def test_a_live_learners_task_is_never_taken_over(board_job: JobCache) -> None:
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    with board.leased("a"):
        assert board.claim("a").task is not None
        deadline = time.monotonic() + 4 * LEASE_S
        while time.monotonic() < deadline:  # several lease lengths: the heartbeat keeps "a" alive
            other = board.claim("b")
            assert other.task is None and other.next_expiry_ms is not None
            board.wait(min(1.0, (other.next_expiry_ms - other.now_ms) / 1000 + 0.05))
        done = board.claim("a", finished=(tid, gradient("a", tid)))
    assert done.stored is not None and board_job.gradients.length() == 1


def test_a_holder_whose_lease_ran_out_stores_nothing(board_job: JobCache) -> None:
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    assert board.claim("slow").task is not None  # no heartbeat: the lease runs out
    time.sleep(LEASE_S + 0.2)  # the lease is a span of time: nothing to await but its end
    taken = board.claim("b")
    assert taken.task is not None and taken.task.id == tid
    late = board.claim("slow", finished=(tid, gradient("slow", tid)))
    assert late.lost and late.stored is None and board_job.gradients.length() == 0
    stored = board.claim("b", finished=(tid, gradient("b", tid)))
    assert stored.stored is not None and board_job.gradients.length() == 1
    assert [board_job.gradients.meta(e).learner_id for e in board_job.gradients.read()] == ["b"]


def test_an_evicted_holders_task_is_taken_over_at_once_and_its_late_gradient_is_not_stored(
    board_job: JobCache,
) -> None:
    """Eviction (the platform reports the holder's instance gone) ends a lease of any length: the waiting learner is
    woken and takes the task, and should the evicted holder still finish, its gradient is not stored."""
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    assert board.claim("gone").task is not None
    # Leases are LEASE_S long here: make this one outlast the test by far (the server's clock is this machine's).
    board_job.client.zadd(board_job.keys.learner_deadlines, {"gone": int(time.time() * 1000) + 600_000})
    waiting = board.claim("b")
    assert waiting.task is None and waiting.next_expiry_ms is not None and waiting.held.keys() == {"gone", "b"}
    board_job.client.delete(board_job.keys.tasks_wake)  # the enqueue's wake-ups: only the eviction's may follow
    board.evict("gone")
    assert board_job.client.blpop([board_job.keys.tasks_wake], timeout=5) is not None  # idle learners are woken
    taken = board.claim("b")
    assert taken.task is not None and taken.task.id == tid and "gone" not in taken.held
    late = board.claim("gone", finished=(tid, gradient("gone", tid)))
    assert late.lost and board_job.gradients.length() == 0
    done = board.claim("b", finished=(tid, gradient("b", tid)))
    assert done.stored is not None and board_job.gradients.length() == 1


def test_a_killed_holders_task_is_taken_over_once(cache_conn: Cache, board_job: JobCache) -> None:
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    env = {**os.environ, "STELLARIS_JOB_LEARNER_LEASE_S": str(LEASE_S)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cache.workers", "hold-task", cache_conn.url, board_job.keys.job, "doomed"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == tid  # the worker holds the task and keeps its lease fresh
        assert board.claim("rescuer").task is None  # alive: not taken
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_pid_gone(proc.pid, 10)
    finally:
        proc.kill()
        proc.wait()
    claim = board.claim("rescuer")
    while claim.task is None:  # wait for the dead holder's lease to run out, woken at its expiry
        assert claim.next_expiry_ms is not None
        board.wait((claim.next_expiry_ms - claim.now_ms) / 1000 + 0.05)
        claim = board.claim("rescuer")
    assert claim.task is not None and claim.task.id == tid
    done = board.claim("rescuer", finished=(tid, gradient("rescuer", tid)))
    assert done.stored is not None and done.outstanding == 0 and board_job.gradients.length() == 1


def test_a_task_delivered_too_often_is_dead_lettered(board_job: JobCache) -> None:
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    assert board.claim("x1").task is not None
    board.leave("x1")  # gone without a gradient (as if killed after its lease ran out)
    assert board.claim("x2").task is not None  # second delivery: max_attempts is 2
    board.leave("x2")
    claim = board.claim("x3")
    assert claim.task is None and claim.dead_lettered == 1 and claim.outstanding == 0
    [(_, letter)] = board.read_dead_letters()
    assert letter["id"] == tid and letter["kind"] == "task" and "2 deliveries" in letter["reason"]
    assert board_job.client.xlen(board_job.keys.control) == 1  # the parameter function is woken


def test_dead_letter_only_by_the_holder(board_job: JobCache) -> None:
    board = board_job.board
    [tid] = board.enqueue(tasks(1), close_round=1, timeout_s=1)
    board.claim("a")
    assert not board.dead_letter("b", tid, "not b's task")
    assert board.dead_letter("a", tid, "CodecError: corrupt")
    assert board.outstanding() == 0 and [f["reason"] for _, f in board.read_dead_letters()] == ["CodecError: corrupt"]


def test_enqueue_waits_for_room_and_closes_the_round_last(cache_conn: Cache, job_id: str) -> None:
    job = JobCache(cache_conn.client, job_id, JobLimits(task_maxlen=2))
    try:
        job.policies.initialise(b"w0")
        with pytest.raises(Exception, match="stayed full"):
            job.board.enqueue(tasks(3), close_round=1, timeout_s=0.1)
        assert job.board.outstanding() == 2 and job.board.claim("a").closed_round == 0  # not closed: one is missing
    finally:
        job.delete()
