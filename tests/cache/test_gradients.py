"""The parameter function's reader of a job's gradient and control streams (cache/tasks.py): each gradient
read once, by header; a poisoned one returned apart and dropped into the dead letters; a blocking read ended by a
gradient or by a stop event, never by a control event sent before the reader began."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cache import FencingError, GradientMeta, GradientRecord, JobCache
from cache.tasks import GradientFeed


def gradient(task: str, base_version: int = 0) -> GradientRecord:
    return GradientRecord(GradientMeta("l1", base_version, task, 1), {"w": torch.ones(2)})


def test_each_gradient_is_read_once_by_its_header(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    feed = GradientFeed(job, count=2)
    ids = [job.gradients.put(gradient(f"t{i}")) for i in range(3)]
    first = feed.read(held=0)
    assert [(e.id, m.task_id) for e, m in first.gradients] == [(ids[0], "t0"), (ids[1], "t1")]  # `count` at most
    assert first.poisoned == [] and feed.after == ids[1]
    assert [e.id for e, _ in feed.read(held=0, count=10).gradients] == [ids[2]]
    assert feed.read(held=0).gradients == []
    # A publish returns what landed after the reader's place: taken as read.
    later = job.gradients.put(gradient("t3"))
    [entry] = job.gradients.read(feed.after)
    assert [m.task_id for _, m in feed.take([entry], held=0).gradients] == ["t3"] and feed.after == later
    assert job.gradients.record(entry).meta.task_id == "t3"  # the arrays stay in the entry, decoded on demand


def test_a_poisoned_header_is_returned_apart_and_dropped_into_the_dead_letters(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    feed = GradientFeed(job)
    bad = job.client.xadd(job.keys.grad, {b"h": b"\xc1 not a gradient"}).decode()
    ahead = job.gradients.put(gradient("t-ahead", base_version=5))  # a version never published
    good = job.gradients.put(gradient("t-ok"))
    landed = feed.read(held=0)
    assert [e.id for e, _ in landed.gradients] == [good]
    assert [gid for gid, _ in landed.poisoned] == [bad, ahead]
    assert "Error: " in landed.poisoned[0][1] and "ahead of the newest published" in landed.poisoned[1][1]
    assert all(feed.drop(gid, reason) for gid, reason in landed.poisoned)
    assert not feed.drop(bad, "again")  # gone already
    assert job.gradients.length() == 1
    assert [(f["kind"], f["id"]) for _, f in job.dead_letters.read()] == [("gradient", bad), ("gradient", ahead)]


def test_a_store_moved_past_the_readers_version_fences_it(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    lease = job.policies.acquire("other")
    job.policies.publish(lease, expected_version=0, weights=b"w1")
    job.gradients.put(gradient("t", base_version=1))
    with pytest.raises(FencingError):
        GradientFeed(job).read(held=0)  # it holds version 0; another holder published 1


def test_a_wait_ends_when_a_gradient_lands_or_a_stop_arrives(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    job.stop_round(1)  # sent before the reader began: not its own
    feed = GradientFeed(job)
    t0 = time.monotonic()
    assert feed.wait(0.2, held=0).gradients == [] and not feed.stopped
    assert time.monotonic() - t0 >= 0.15
    threading.Timer(0.1, lambda: job.gradients.put(gradient("t"))).start()
    landed = feed.wait(10, held=0)
    assert [m.task_id for _, m in landed.gradients] == ["t"] and not feed.stopped
    threading.Timer(0.1, lambda: job.stop_round(1)).start()
    t0 = time.monotonic()
    assert feed.wait(10, held=0).gradients == [] and feed.stopped
    assert time.monotonic() - t0 < 5
