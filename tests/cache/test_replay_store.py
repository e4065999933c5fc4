"""The replay store on a real Redis (single server and cluster): bounds by entries, bytes and actor hold while
producers outrun consumers, eviction is atomic and oldest first, evicted entries' priorities stay gone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cache import Cache, CacheError, JobCache, TrajectoryBatch
from cache.replay import ReplaySettings, ReplayStore, make_pattern, replay_id
from cache.replay.fifo import fifo_choice
from contract.records import TRAJECTORY_ARRAYS


def batch(actor: str = "a0", steps: int = 16, seed: int = 0) -> TrajectoryBatch:
    rng = np.random.default_rng(seed)
    arrays = {k: rng.standard_normal((steps, 2)).astype(np.float32) for k in TRAJECTORY_ARRAYS}
    return TrajectoryBatch(actor, 0, steps, arrays, {})


def land(job: JobCache, actor: str = "a0", seed: int = 0) -> str:
    """A batch put on the job's trajectory stream and taken by the control plane's group (as a round does)."""
    bid = job.trajectories.put(batch(actor, seed=seed))
    assert [i for i, _ in job.trajectories.take("control", count=1, block_s=1.0)] == [bid]
    return bid


def store(job: JobCache, **kwargs: object) -> ReplayStore:
    return ReplayStore(job.client, job.keys, **kwargs)  # type: ignore[arg-type]


def test_bounds_hold_while_producers_outrun_consumers(job: JobCache) -> None:
    """Two producers land and store batches as fast as they can while nothing samples: entries and payload bytes
    never exceed their bounds, and the store's structures agree after every concurrent add."""
    probe = store(job)
    probe.add(land(job), "probe")
    one = probe.entries()[0].size_bytes  # the payload bytes of one batch
    job.client.unlink(*[job.keys.replay(p) for p in ("data", "index", "order", "actors", "priority", "state")])
    bound = store(job, capacity=6, bytes_max=4 * one + one // 2)  # the byte bound binds first: 4 entries
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def produce(actor: str) -> None:
        try:
            for i in range(30):
                job.trajectories.put(batch(actor, seed=i))
                # Whichever landed batch the group hands this consumer (the other producer's, maybe).
                for bid, meta in job.trajectories.take(actor, count=1, block_s=1.0):
                    added = bound.add(bid, meta.actor_id)
                    job.trajectories.ack([bid])  # the stream copy goes; the replay copy stays
                    seen.append((added.bytes, bound.state().entries))
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(f"a{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(seen) == 60
    state = bound.state()
    assert max(b for b, _ in seen) <= bound.bytes_max and max(n for _, n in seen) <= 4, (seen, one, bound.bytes_max)
    assert state.peak_bytes <= bound.bytes_max and state.entries == 4 and state.evicted == 60 - 4
    assert bound.check() == []
    assert job.trajectories.stream.length() == 1  # only the unacknowledged probe: the job's stream did not grow


def test_eviction_by_count_is_oldest_first_and_replayed_batches_read_through_the_batch_lookup(job: JobCache) -> None:
    s = store(job, capacity=3)
    ids = [land(job, seed=i) for i in range(5)]
    for bid in ids:
        s.add(bid, "a0")
    job.trajectories.ack(ids)
    assert [e.rid for e in s.entries()] == [replay_id(b) for b in ids[2:]]
    got = job.trajectories.get(replay_id(ids[4]))  # what a learner's task reads
    assert got is not None
    np.testing.assert_array_equal(got.arrays["rewards"], batch(seed=4).arrays["rewards"])
    assert job.trajectories.get(replay_id(ids[0])) is None  # evicted
    assert s.state().evicted == 2 and s.check() == []
    ttl = [job.client.pttl(job.keys.replay(p)) for p in ("data", "index", "order", "actors", "state")]
    assert all(0 < t <= job.limits.ttl_s * 1000 for t in ttl), ttl


def test_fifo_per_actor_bound_keeps_each_actors_newest_in_order(job: JobCache) -> None:
    s = store(job, capacity=10, per_actor=2)
    order = ["a", "a", "b", "a", "b", "b", "a"]
    ids = [land(job, actor, seed=i) for i, actor in enumerate(order)]
    for bid, actor in zip(ids, order, strict=True):
        s.add(bid, actor)
    held = s.entries()
    by_actor = {a: [e.rid for e in held if e.actor == a] for a in ("a", "b")}
    assert by_actor == {"a": [replay_id(ids[3]), replay_id(ids[6])], "b": [replay_id(ids[4]), replay_id(ids[5])]}
    # Replay order: round-robin over actors, each from its oldest; the next round goes on after the cursors.
    first, cursors = fifo_choice(held, 2, {})
    assert first == (replay_id(ids[3]), replay_id(ids[4]))
    second, _ = fifo_choice(held, 3, cursors)
    assert second == (replay_id(ids[6]), replay_id(ids[5]), replay_id(ids[3]))
    assert s.check() == []


def test_priorities_of_evicted_entries_are_not_resurrected(job: JobCache) -> None:
    s = store(job, capacity=2, prioritized=True)
    ids = [land(job, seed=i) for i in range(3)]
    s.add(ids[0], "a0")
    assert s.update_priorities({ids[0]: 5.0}) == 1  # a fresh id is addressed by its replay id
    s.add(ids[1], "a0")
    assert {e.rid: e.priority for e in s.entries()}[replay_id(ids[1])] == 5.0  # new: the highest priority seen
    s.add(ids[2], "a0")  # evicts ids[0]
    assert s.update_priorities({ids[0]: 9.0, ids[2]: 0.5}) == 1
    prios = {e.rid: e.priority for e in s.entries()}
    assert prios == {replay_id(ids[1]): 5.0, replay_id(ids[2]): 0.5}
    assert job.client.zscore(job.keys.replay("priority"), replay_id(ids[0])) is None
    assert s.check() == []
    with pytest.raises(ValueError, match="positive"):
        s.update_priorities({ids[2]: 0.0})


def test_a_batch_over_the_byte_bound_is_refused_naming_the_field(job: JobCache) -> None:
    bid = land(job)
    with pytest.raises(CacheError, match="replay_capacity_mb"):
        store(job, bytes_max=100).add(bid, "a0")
    assert store(job).entries() == []


def test_full_batch_writes_no_replay_key(job: JobCache) -> None:
    pattern = make_pattern(ReplaySettings(), job.client, job.keys)
    bid = land(job)
    assert pattern.add([(bid, "a0")]) == 0 and pattern.sample(4, round_k=1).ids == ()
    assert list(job.client.scan_iter(match=job.keys.replay("*"))) == []


def test_put_rebuilds_a_store_in_another_namespace_as_it_was(job: JobCache, cache_conn: Cache, job_id: str) -> None:
    """What a checkpoint keeps (entries with seq and priority, their fields, the counters) put into a new job's
    store gives the same entries, fields and counters; a later arrival continues after the restored seq and gets the
    highest priority seen; a smaller bound evicts the oldest restored entries."""
    s = store(job, capacity=3, prioritized=True)
    ids = [land(job, actor=f"a{i % 2}", seed=i) for i in range(4)]
    for i, bid in enumerate(ids):
        s.add(bid, f"a{i % 2}")  # the fourth evicts the first
    s.update_priorities({ids[1]: 7.5, ids[2]: 0.25})
    held, counters = s.entries(), s.counters()
    assert counters["seq"] == "4" and counters["evicted"] == "1" and float(counters["max_priority"]) == 7.5
    other = JobCache(cache_conn.client, f"{job_id}-e1")
    try:
        t = store(other, capacity=3, prioritized=True)
        for e in held:
            assert t.put(e, s.read(e.rid) or {}).added
        t.set_counters(counters)
        assert t.entries() == held and t.state() == s.state() and t.check() == []
        assert all(t.read(e.rid) == s.read(e.rid) for e in held)
        assert not t.put(held[0], s.read(held[0].rid) or {}).added  # held already: nothing changes
        bid = land(other, actor="a9", seed=9)
        t.add(bid, "a9")
        new = t.entries()[-1]
        assert (new.rid, new.seq, new.priority) == (replay_id(bid), 5, 7.5)
        small = JobCache(cache_conn.client, f"{job_id}-e2")
        try:
            u = store(small, capacity=2)
            assert [u.put(e, s.read(e.rid) or {}).evicted for e in held] == [0, 0, 1]
            assert [e.rid for e in u.entries()] == [e.rid for e in held[1:]] and u.check() == []
        finally:
            small.delete()
    finally:
        other.delete()
    with pytest.raises(ValueError, match="unknown counters"):
        s.set_counters({"bytes": "0"})  # bytes follow the entries: never set from outside
