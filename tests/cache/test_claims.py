"""Atomic batch claims (cache/claims.py) on a real redis-server and a real Redis Cluster: all or nothing, and two
claimers racing over one stream never share a batch."""

from __future__ import annotations

import threading

import pytest

from cache import JobCache
from cache.claims import BatchClaims
from tests.cache.test_streams import batch

RACE_BATCHES = 300


def test_claim_is_all_or_nothing(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream)
    first = job.trajectories.put(batch(actor="a0", steps=4))
    assert claims.claim("t1", at_least=2) == []  # one landed, two needed: nothing taken
    second = job.trajectories.put(batch(actor="a1", steps=8))
    got = claims.claim("t1", at_least=2)
    assert [i for i, _ in got] == [first, second]
    assert [m.env_steps for _, m in got] == [4, 8] and got[1][1].actor_id == "a1"
    assert claims.claim("t2", at_least=1) == []  # both belong to t1 now
    assert job.trajectories.stream.consumer_pending() == {"t1": 2}


def test_claim_takes_at_most(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream)
    ids = [job.trajectories.put(batch(steps=s)) for s in (1, 2, 3, 4, 5)]
    assert [i for i, _ in claims.claim("t", at_least=2, at_most=3)] == ids[:3]
    assert [i for i, _ in claims.claim("t", at_least=2, at_most=3)] == ids[3:]
    assert claims.claim("t", at_least=1) == []


def test_a_claim_whose_reply_was_lost_is_found_again_by_its_claimer(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream)
    ids = [job.trajectories.put(batch(steps=s)) for s in (1, 2, 3)]
    claims.claim("t", at_least=3)  # delivered, but say the reply never reached the claimer (Redis killed mid-call)
    assert claims.claim("t", at_least=1) == []  # no later claim returns them
    assert [i for i, _ in claims.orphaned("t", known={ids[0]})] == ids[1:]  # the one it holds is left out
    assert [m.env_steps for _, m in claims.orphaned("t", known=set())] == [1, 2, 3]
    job.trajectories.ack(ids[:2])  # acknowledged (deleted) batches are not orphans
    assert [i for i, _ in claims.orphaned("t", known=set())] == ids[2:]
    assert claims.orphaned("other", known=set()) == []  # another claimer's are not its own


def test_claim_waits_for_a_landing(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream)
    job.trajectories.put(batch(steps=2))
    landed = threading.Event()

    def land() -> None:
        landed.wait()
        job.trajectories.put(batch(steps=3))

    producer = threading.Thread(target=land)
    producer.start()
    landed.set()
    got = claims.claim("t", at_least=2, block_s=30.0)  # returns on the landing, well before the bound
    producer.join()
    assert [m.env_steps for _, m in got] == [2, 3]


def test_bad_claims_name_the_argument(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream)
    with pytest.raises(ValueError, match="at_least"):
        claims.claim("t", at_least=0)
    with pytest.raises(ValueError, match="at_least"):
        claims.claim("t", at_least=job.limits.trajectory_maxlen + 1)
    with pytest.raises(ValueError, match="at_most"):
        claims.claim("t", at_least=3, at_most=2)
    with pytest.raises(ValueError, match="claimer"):
        claims.claim("", at_least=1)


def test_racing_claimers_never_share_a_batch(job: JobCache) -> None:
    """A producer lands RACE_BATCHES batches (blocked by the stream's bound until claimed batches are acked) while
    two threads claim groups of 2-3 as fast as they can: every batch goes to exactly one claim, every claim is a
    whole group."""
    claims = BatchClaims(job.trajectories.stream)
    produced: list[str] = []
    taken: dict[str, list[list[str]]] = {"t1": [], "t2": []}
    done = threading.Event()

    def produce() -> None:
        for i in range(RACE_BATCHES):
            produced.append(job.trajectories.put(batch(actor=f"a{i % 4}", steps=1 + i % 7), timeout_s=60.0))
        done.set()

    def consume(name: str) -> None:
        while True:
            got = claims.claim(name, at_least=2, at_most=3, block_s=0.2)
            if got:
                ids = [i for i, _ in got]
                taken[name].append(ids)
                job.trajectories.ack(ids)  # room for the producer, as the trainer acks a round's batches
            elif done.is_set() and job.trajectories.stream.length() < 2:
                return

    threads = [threading.Thread(target=produce)] + [threading.Thread(target=consume, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    groups = taken["t1"] + taken["t2"]
    assert all(2 <= len(g) <= 3 for g in groups)
    flat = [i for g in groups for i in g]
    assert len(flat) == len(set(flat))  # no batch claimed twice
    left = claims.claim("t3", at_least=1, at_most=2)  # fewer than a group may remain: the last 0 or 1
    assert len(left) <= 1
    assert sorted(flat + [i for i, _ in left]) == sorted(produced)  # and none lost
    assert taken["t1"] and taken["t2"], "both claimers should have won some groups"
