import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cache import (
    BackpressureTimeout,
    Cache,
    CodecError,
    GradientMeta,
    GradientRecord,
    JobCache,
    JobLimits,
    LearnerTask,
    TrajectoryBatch,
)
from cache.streams import BoundedStream
from contract.records import TRAJECTORY_ARRAYS
from tests.procs import wait_pid_gone

ROOT = Path(__file__).resolve().parents[2]


def batch(actor: str = "a0", version: int = 0, steps: int = 16) -> TrajectoryBatch:
    rng = np.random.default_rng(steps)
    arrays = {k: rng.standard_normal((steps, 2)).astype(np.float32) for k in TRAJECTORY_ARRAYS}
    return TrajectoryBatch(actor, version, steps, arrays, {"episode_returns": [1.5]})


def test_batch_consume_and_ack(job: JobCache) -> None:
    ids = [job.trajectories.put(batch(steps=s)) for s in (4, 8)]
    got = job.trajectories.take("l1", count=5, block_s=1.0)
    assert [i for i, _ in got] == ids
    assert got[1][1].env_steps == 8 and got[1][1].info == {"episode_returns": [1.5]}  # the header alone
    full = job.trajectories.get(ids[0])
    assert full is not None
    np.testing.assert_array_equal(full.arrays["rewards"], batch(steps=4).arrays["rewards"])
    assert job.trajectories.take("l2", block_s=0.0) == []  # each batch goes to one consumer
    assert job.trajectories.stream.pending() == 2
    assert job.trajectories.ack(ids) == 2
    assert job.trajectories.ack(ids) == 0  # a second ack is a no-op
    assert job.trajectories.stream.length() == 0 and job.trajectories.stream.pending() == 0


def test_entries_carry_each_array_as_its_own_field(job: JobCache) -> None:
    bid = job.trajectories.put(batch(steps=4))
    [(_, fields)] = job.client.xrange(job.keys.traj)
    assert b"h" in fields and len(fields) == 1 + len(TRAJECTORY_ARRAYS)  # header + one field per array
    assert len(fields[b"a2"]) == 4 * 2 * 4  # rewards, float32 [4, 2]: the raw buffer, nothing around it
    grad = GradientRecord(GradientMeta("l1", 3, "1-0", 2, {"loss": 0.5}), {"w": torch.ones(2, 3)})
    gid = job.gradients.put(grad)
    [entry] = job.gradients.read()
    assert entry.id == gid and job.gradients.meta(entry).base_version == 3
    rec = job.gradients.record(entry)
    assert rec.meta.task_id == "1-0" and rec.meta.stats == {"loss": 0.5}
    assert torch.equal(rec.tensors["w"], torch.ones(2, 3))
    assert job.trajectories.get(bid) is not None and job.trajectories.get("0-1") is None


def test_blocking_read_wakes_on_add(job: JobCache) -> None:
    result: list = []
    reader = threading.Thread(target=lambda: result.extend(job.trajectories.take("l1", block_s=10.0)))
    reader.start()
    job.trajectories.put(batch(steps=3))
    reader.join(timeout=10)
    assert not reader.is_alive() and result[0][1].env_steps == 3


def test_read_times_out_empty(job: JobCache) -> None:
    assert job.trajectories.take("l1", block_s=0.05) == []


def test_stream_is_capped_and_producer_gets_backpressure(cache_conn: Cache, job_id: str) -> None:
    job = JobCache(cache_conn.client, job_id, JobLimits(trajectory_maxlen=2))
    try:
        ids = [job.trajectories.put(batch(steps=s), timeout_s=1) for s in (1, 2)]
        with pytest.raises(BackpressureTimeout, match="stayed full"):
            job.trajectories.put(batch(steps=3), timeout_s=0.05)
        assert job.trajectories.stream.length() == 2  # nothing stored was lost or trimmed

        # A producer blocked on the full stream is woken by a consumer's ack, not by polling.
        done: list[str] = []
        producer = threading.Thread(target=lambda: done.append(job.trajectories.put(batch(steps=4), timeout_s=30)))
        producer.start()
        job.trajectories.take("l1", block_s=1.0)
        job.trajectories.ack([ids[0]])
        producer.join(timeout=30)
        assert done and job.trajectories.stream.length() == 2
    finally:
        job.delete()


def test_a_consumed_wait_ends_when_the_entry_is_acknowledged_not_before(job: JobCache) -> None:
    ids = [job.trajectories.put(batch(steps=s)) for s in (1, 2)]
    stream = job.trajectories.stream
    assert not stream.wait_consumed(ids[0], timeout_s=0.05)  # still queued
    job.trajectories.take("l1", count=2, block_s=1.0)
    assert not stream.wait_consumed(ids[0], timeout_s=0.05)  # delivered is not consumed: the round may still train it
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(stream.wait_consumed(ids[0], timeout_s=30)))
    waiter.start()
    job.trajectories.ack([ids[1]])  # another batch's ack wakes the waiter, which looks again and keeps waiting
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not done
    job.trajectories.ack([ids[0]])
    waiter.join(timeout=30)
    assert done == [True] and stream.length() == 0
    assert stream.wait_consumed(ids[0], timeout_s=0.0)  # an entry already gone returns at once


def test_every_key_written_has_a_ttl(job: JobCache) -> None:
    bid = job.trajectories.put(batch())
    job.trajectories.take("l1", block_s=1.0)
    job.policies.initialise(b"w0", b"o0")
    job.board.enqueue([LearnerTask(1, (bid,), 0, 0, 1)], close_round=1, timeout_s=1)
    claim = job.board.claim("l1")
    assert claim.task is not None
    grad = GradientRecord(GradientMeta("l1", 0, claim.task.id, 1), {"w": torch.ones(1)})
    job.board.claim("l1", finished=(claim.task.id, grad))
    job.board.dead_letter("l1", "0-1", "nothing")
    job.learners.register("l1", 0)
    lease = job.policies.acquire("p")
    job.policies.publish(lease, expected_version=0, weights=b"w1")
    job.policies.release(lease)
    keys = list(job.client.scan_iter(match=job.keys.pattern()))
    assert len(keys) >= 8
    for key in keys:
        assert job.client.pttl(key) > 0, f"{key!r} has no TTL"


def test_corrupt_entry_raises_codec_error(job: JobCache) -> None:
    job.trajectories.stream.add([b"d", b"\x80\x04not ours"], timeout_s=1)
    with pytest.raises(CodecError, match="trajectory batch: entry has no header field"):
        job.trajectories.take("l1", block_s=1.0)
    job.trajectories.stream.add([b"h", b"\xc1garbage"], timeout_s=1)
    with pytest.raises(CodecError, match="trajectory batch: corrupt header"):
        job.trajectories.take("l1", block_s=1.0)


def test_invalid_stream_bounds_are_refused(cache_conn: Cache) -> None:
    with pytest.raises(ValueError, match="maxlen"):
        BoundedStream(cache_conn.client, "stl:{x}:s", group="g", maxlen=0, ttl_s=1)
    with pytest.raises(ValueError, match="invalid job id"):
        JobCache(cache_conn.client, "bad{id}")


def test_batch_of_a_killed_consumer_is_reclaimed(cache_conn: Cache, job: JobCache) -> None:
    bid = job.trajectories.put(batch(steps=5))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cache.workers", "consume", cache_conn.url, job.keys.job, "doomed"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == bid  # the consumer holds the batch
        # A live consumer's fresh entry is not stolen.
        assert job.trajectories.reclaim("rescuer", min_idle_s=60.0) == []
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_pid_gone(proc.pid, 10)
    finally:
        proc.kill()
        proc.wait()
    assert job.trajectories.stream.consumer_pending() == {"doomed": 1}
    [(rid, rec)] = job.trajectories.reclaim("rescuer", min_idle_s=0.0)
    assert rid == bid and rec.env_steps == 5
    assert job.trajectories.stream.consumer_pending() == {"rescuer": 1}
    assert job.trajectories.ack([rid]) == 1


def test_blpop_timeouts_never_round_to_block_forever() -> None:
    from cache.streams import MAX_BLOCK_S, MIN_BLOCK_S, blpop_timeout

    # Redis takes a BLPOP timeout of 0.001 s or less as 0: block forever. A wait with a sliver left gets the floor.
    assert [blpop_timeout(s) for s in (-1.0, 0.0, 0.0005, 0.001, 0.5, 99.0)] == [
        MIN_BLOCK_S,
        MIN_BLOCK_S,
        MIN_BLOCK_S,
        MIN_BLOCK_S,
        0.5,
        MAX_BLOCK_S,
    ]
    assert MIN_BLOCK_S > 0.001
