"""Atomic batch claims (cache/trajectories.py) on a real redis-server and a real Redis Cluster: all or nothing, two
claimers racing over one stream never share a batch, and a poisoned batch is dead-lettered by the claim that takes it
while the others are handed out."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from cache import BatchMeta, JobCache, TrajectoryBatch
from cache.trajectories import BatchClaims
from contract.codec import HEADER_FIELD
from tests.cache.test_streams import batch

RACE_BATCHES = 300


def test_claim_is_all_or_nothing(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
    first = job.trajectories.put(batch(actor="a0", steps=4))
    assert claims.claim("t1", at_least=2) == []  # one landed, two needed: nothing taken
    second = job.trajectories.put(batch(actor="a1", steps=8))
    got = claims.claim("t1", at_least=2)
    assert [i for i, _ in got] == [first, second]
    assert [m.env_steps for _, m in got] == [4, 8] and got[1][1].actor_id == "a1"
    assert claims.claim("t2", at_least=1) == []  # both belong to t1 now
    assert job.trajectories.stream.consumer_pending() == {"t1": 2}


def test_claim_takes_at_most(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
    ids = [job.trajectories.put(batch(steps=s)) for s in (1, 2, 3, 4, 5)]
    assert [i for i, _ in claims.claim("t", at_least=2, at_most=3)] == ids[:3]
    assert [i for i, _ in claims.claim("t", at_least=2, at_most=3)] == ids[3:]
    assert claims.claim("t", at_least=1) == []


def test_a_claim_whose_reply_was_lost_is_found_again_by_its_claimer(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
    ids = [job.trajectories.put(batch(steps=s)) for s in (1, 2, 3)]
    claims.claim("t", at_least=3)  # delivered, but say the reply never reached the claimer (Redis killed mid-call)
    assert claims.claim("t", at_least=1) == []  # no later claim returns them
    assert [i for i, _ in claims.orphaned("t", known={ids[0]})] == ids[1:]  # the one it holds is left out
    assert [m.env_steps for _, m in claims.orphaned("t", known=set())] == [1, 2, 3]
    job.trajectories.ack(ids[:2])  # acknowledged (deleted) batches are not orphans
    assert [i for i, _ in claims.orphaned("t", known=set())] == ids[2:]
    assert claims.orphaned("other", known=set()) == []  # another claimer's are not its own


def test_claim_waits_for_a_landing(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
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
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
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
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
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


def _meta(b: TrajectoryBatch) -> BatchMeta:
    return BatchMeta(b.actor_id, b.behaviour_version, b.env_steps, b.info)


def _letters(job: JobCache) -> list[tuple[str, str]]:
    return [(f["kind"], f["id"]) for _, f in job.dead_letters.read()]


def test_an_undecodable_batch_is_dead_lettered_by_the_claim_and_the_others_are_handed_out(job: JobCache) -> None:
    """Before, the claim's decode error ended the control plane (the run exited 1)."""
    claims = BatchClaims(job.trajectories.stream, job.dead_letters)
    first = job.trajectories.put(batch(actor="a0", steps=4))
    poison = job.trajectories.stream.add([HEADER_FIELD, b"\xc1 not a header"], timeout_s=1.0)
    last = job.trajectories.put(batch(actor="a1", steps=8))
    got = claims.claim("t", at_least=3)
    assert [i for i, _ in got] == [first, last] and [m.env_steps for _, m in got] == [4, 8]
    assert _letters(job) == [("trajectory", poison)]
    [(_, letter)] = job.dead_letters.read()
    assert "CodecError" in letter["reason"] and "corrupt header" in letter["reason"]
    assert claims.given_up == 1
    assert job.trajectories.stream.get(poison) is None  # off the stream: its room is free again
    assert job.trajectories.stream.consumer_pending() == {"t": 2}
    assert job.board.read_dead_letters() == job.dead_letters.read()  # the stream info.csv counts
    assert claims.claim("t", at_least=1) == []  # nothing left, and the poison is not handed out later


def test_a_header_only_batch_is_poison_where_batches_carry_their_arrays(job: JobCache) -> None:
    """The trajectories profile: a header whose arrays are missing (cut off, or never written) is dead-lettered; under
    gradients_at_actors (payloads=False) a header alone is the whole batch, and is handed out."""
    full = batch(actor="a0", steps=4)
    header_only = job.trajectories.stream.add(full.fields()[:2], timeout_s=1.0)  # the header names 7 arrays
    bare = job.trajectories.put_header(_meta(full))  # a header naming no array at all
    good = job.trajectories.put(full)
    strict = BatchClaims(job.trajectories.stream, job.dead_letters, payloads=True)
    assert [i for i, _ in strict.claim("t", at_least=3)] == [good]
    assert _letters(job) == [("trajectory", header_only), ("trajectory", bare)]
    reasons = [f["reason"] for _, f in job.dead_letters.read()]
    assert "field a0 is missing" in reasons[0] and "lacks arrays" in reasons[1], reasons

    lenient = BatchClaims(job.trajectories.stream, job.dead_letters)  # gradients_at_actors: headers alone
    headers = [job.trajectories.put_header(_meta(full)) for _ in range(2)]
    assert [i for i, _ in lenient.claim("u", at_least=2)] == headers
    assert len(_letters(job)) == 2


def test_a_batch_of_a_version_never_published_or_with_non_finite_values_is_poison(job: JobCache) -> None:
    claims = BatchClaims(job.trajectories.stream, job.dead_letters, version_key=job.keys.policy_version, payloads=True)
    job.client.set(job.keys.policy_version, 3)
    ahead = job.trajectories.put(batch(version=4))
    fine = job.trajectories.put(batch(version=3))
    nan = batch(version=2, steps=5)
    nan_id = job.trajectories.put(replace(nan, arrays={**nan.arrays, "rewards": np.full((5, 2), np.nan, np.float32)}))
    assert [i for i, _ in claims.claim("t", at_least=3)] == [fine]
    assert _letters(job) == [("trajectory", ahead), ("trajectory", nan_id)]
    reasons = [f["reason"] for _, f in job.dead_letters.read()]
    assert "behaviour version 4 is ahead of the newest published policy version 3" in reasons[0]
    assert "non-finite values in rewards" in reasons[1]


def test_orphaned_batches_are_checked_as_claimed_ones_are(job: JobCache) -> None:
    """A claim whose reply was lost left its batches pending: when they are found again, a poisoned one among them is
    dead-lettered then, and only once."""
    claims = BatchClaims(job.trajectories.stream, job.dead_letters, payloads=True)
    good = job.trajectories.put(batch(steps=3))
    poison = job.trajectories.stream.add([HEADER_FIELD, b"\xc1"], timeout_s=1.0)
    job.trajectories.stream.read("t", count=2)  # delivered to t, as a claim whose reply was lost leaves them
    assert [i for i, _ in claims.orphaned("t", known=set())] == [good]
    assert [i for i, _ in claims.orphaned("t", known=set())] == [good]
    assert _letters(job) == [("trajectory", poison)]
