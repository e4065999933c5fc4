import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cache import Cache, FencingError, JobCache, JobLimits, LeaseUnavailable, VersionNotFound

ROOT = Path(__file__).resolve().parents[2]


def publish_once(job: JobCache, weights: bytes, optim: bytes = b"") -> int:
    lease = job.policies.acquire("param")
    try:
        current = job.policies.version()
        assert current is not None
        return job.policies.publish(lease, expected_version=current, weights=weights, optimizer_state=optim)
    finally:
        job.policies.release(lease)


def test_initialise_is_idempotent_and_publish_advances(job: JobCache) -> None:
    assert job.policies.version() is None
    with pytest.raises(VersionNotFound, match="no policy yet"):
        job.policies.latest()
    assert job.policies.initialise(b"w0", b"o0") == 0
    assert job.policies.initialise(b"other") == 0  # a second initialise changes nothing
    assert job.policies.latest() == (0, b"w0")
    assert publish_once(job, b"w1", b"o1") == 1
    assert publish_once(job, b"w2") == 2  # empty optimizer state keeps the previous one
    assert job.policies.latest() == (2, b"w2")
    assert job.policies.get(1) == b"w1"
    assert job.policies.optimizer_state() == b"o1"


def test_only_the_newest_k_versions_are_kept(cache_conn: Cache, job_id: str) -> None:
    job = JobCache(cache_conn.client, job_id, JobLimits(keep_versions=3, retired_grace_s=0))
    try:
        job.policies.initialise(b"w0")
        for v in range(1, 6):
            publish_once(job, f"w{v}".encode())
        assert job.policies.get_many([0, 1, 2, 3, 4, 5]) == {3: b"w3", 4: b"w4", 5: b"w5"}
        with pytest.raises(VersionNotFound, match="newest 3 versions"):
            job.policies.get(2)
    finally:
        job.delete()


def test_a_retired_version_lingers_only_while_a_learner_holds_it(job: JobCache) -> None:
    """At most K versions plus those registered learners hold: thousands of publishes leave K keys (a 60 s grace
    for every retired version once kept 4,023 versions against K = 8)."""
    job.policies.initialise(b"w0")
    job.client.hset(job.keys.learners, "learner-a", "1")  # holds version 1
    k = job.limits.keep_versions
    for v in range(1, k + 2):
        publish_once(job, f"w{v}".encode())
    assert not job.client.exists(job.keys.policy(0))  # retired, held by nobody: gone at once
    ttl_ms = job.client.pttl(job.keys.policy(1))  # retired while held: a grace TTL
    assert 0 < ttl_ms <= job.limits.retired_grace_s * 1000
    assert job.client.pttl(job.keys.policy(2)) > job.limits.retired_grace_s * 1000  # still among the newest K
    for v in range(k + 2, 200):
        publish_once(job, f"w{v}".encode())
    stored = [key for key in job.client.scan_iter(match=job.keys.policy(0)[:-1] + "*") if key.split(b":")[-1].isdigit()]
    assert len(stored) == k + 1, stored  # the newest K and the held one


def test_publish_needs_the_lease_and_the_expected_version(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    lease = job.policies.acquire("p1", lease_s=0.05)
    with pytest.raises(LeaseUnavailable, match="held by"):
        job.policies.acquire("p2")
    with pytest.raises(FencingError, match="version is 0, expected 3"):
        job.policies.publish(lease, expected_version=3, weights=b"x")
    # Once the lease lapses and another owner takes it, the stale holder can no longer publish.
    newer = job.policies.acquire("p2", wait_s=5.0)
    assert newer.token > lease.token
    with pytest.raises(FencingError, match="lease not held"):
        job.policies.publish(lease, expected_version=0, weights=b"stale")
    assert job.policies.release(lease) is False  # releasing a lost lease does not free the new holder's
    assert job.policies.publish(newer, expected_version=0, weights=b"w1") == 1
    with pytest.raises(FencingError, match="version is 1, expected 0"):
        job.policies.publish(newer, expected_version=0, weights=b"again")
    assert job.policies.latest() == (1, b"w1")


def test_acquire_waits_for_release_without_polling(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    lease = job.policies.acquire("holder", lease_s=30)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(job.policies.acquire("waiter", wait_s=20)))
    waiter.start()
    job.policies.release(lease)
    waiter.join(timeout=20)
    assert got and got[0].owner == "waiter"


def test_evicting_a_gone_owner_frees_its_lease_at_once_and_fences_it(job: JobCache) -> None:
    """The control plane knows an invocation's owner id, not its token: evicting that owner wakes a waiting
    replacement at once (the lease would have held for 600 s), evicting anyone else frees nothing, and the old
    holder can no longer publish."""
    job.policies.initialise(b"w0")
    dead = job.policies.acquire("parameter-1", lease_s=600)
    assert job.policies.evict("parameter") is False and job.policies.evict("parameter-12") is False  # not its owner
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(job.policies.acquire("parameter-2", wait_s=60)))
    waiter.start()
    assert job.policies.evict("parameter-1") is True
    waiter.join(timeout=60)
    assert got and got[0].owner == "parameter-2" and got[0].token > dead.token
    with pytest.raises(FencingError, match="lease not held"):
        job.policies.publish(dead, expected_version=0, weights=b"stale")
    assert job.policies.evict("parameter-1") is False  # the new holder's lease stays
    assert job.policies.publish(got[0], expected_version=0, weights=b"w1") == 1


def test_wait_for_version_wakes_on_publish(job: JobCache) -> None:
    job.policies.initialise(b"w0")
    assert job.policies.wait_for_version(0, timeout_s=0.05) is None
    seen: list = []
    waiter = threading.Thread(target=lambda: seen.append(job.policies.wait_for_version(0, timeout_s=20)))
    waiter.start()
    publish_once(job, b"w1")
    waiter.join(timeout=20)
    assert seen == [1]
    assert job.policies.wait_for_version(0, timeout_s=0) == 1  # already newer: returns at once


def test_version_counter_under_concurrent_writer_processes(cache_conn: Cache, job: JobCache) -> None:
    job.policies.initialise(b"w0")
    writers, each = 4, 15
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.cache.workers",
                "publish",
                cache_conn.url,
                job.keys.job,
                f"w{i}",
                f"{each}",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    published: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        published += [int(line) for line in out.split()]
    # Every publish got its own version: none lost, none published twice.
    assert sorted(published) == list(range(1, writers * each + 1))
    assert job.policies.version() == writers * each


def test_newer_than_returns_weights_only_when_the_version_changed(job: JobCache) -> None:
    with pytest.raises(VersionNotFound, match="no policy yet"):
        job.policies.newer_than(None)
    job.policies.initialise(b"w0")
    assert job.policies.newer_than(None) == (0, b"w0")
    assert job.policies.newer_than(0) is None
    publish_once(job, b"w1")
    assert job.policies.newer_than(0) == (1, b"w1")
    before = job.client.round_trips  # type: ignore[attr-defined]
    assert job.policies.newer_than(1) is None
    assert job.policies.newer_than(0) == (1, b"w1")
    assert job.client.round_trips - before == 2  # type: ignore[attr-defined]  # one round trip per look


def test_optimizer_state_saved_apart_only_by_the_lease_holder_for_the_newest_version(job: JobCache) -> None:
    job.policies.initialise(b"w0", b"o0")
    lease = job.policies.acquire("p1", lease_s=0.05)
    assert job.policies.publish(lease, expected_version=0, weights=b"w1") == 1  # no optimizer state with it
    assert job.policies.optimizer_state() == b"o0"
    with pytest.raises(FencingError, match="version moved past 0"):
        job.policies.save_optimizer(lease, version=0, optimizer_state=b"o-stale")
    job.policies.save_optimizer(lease, version=1, optimizer_state=b"o1")
    assert job.policies.optimizer_state() == b"o1"
    newer = job.policies.acquire("p2", wait_s=5.0)  # once the lease lapses, the old holder cannot save
    with pytest.raises(FencingError, match="lease not held"):
        job.policies.save_optimizer(lease, version=1, optimizer_state=b"o-old-holder")
    assert job.policies.optimizer_state() == b"o1"
    job.policies.release(newer)


def test_publish_and_ack_returns_the_work_left_after_it_in_its_one_round_trip(job: JobCache) -> None:
    """The parameter function's look after a publish comes with the publish: the gradients it acked are gone from
    the count, an expired learner is dropped, and the rest is what `work_snapshot` says right after."""
    job.policies.initialise(b"w0")
    job.learners.register("alive", 0, lease_s=60)
    job.learners.register("dead", 0, lease_s=0.001)
    used = [job.client.xadd(job.keys.grad, {"h": b"g"}).decode() for _ in range(2)]
    job.client.xadd(job.keys.grad, {"h": b"g3"})
    for _ in range(3):
        job.client.xadd(job.keys.tasks, {"h": b"t"})
    job.board.close(2)
    time.sleep(0.01)  # let the dead learner's lease pass on the server's clock
    lease = job.policies.acquire("param")
    before = job.client.round_trips  # type: ignore[attr-defined]
    version, work, landed = job.policies.publish_and_ack(lease, expected_version=0, weights=b"w1", gradient_ids=used)
    assert job.client.round_trips - before == 1  # type: ignore[attr-defined]
    assert (version, work, landed) == (1, (3, [0], 2, 1), [])  # none asked for
    assert (work.tasks, work.held, work.closed, work.gradients) == (3, [0], 2, 1)
    assert job.learners.work_snapshot() == work


def test_publish_and_ack_brings_the_gradients_that_landed_after_the_last_one_read(job: JobCache) -> None:
    """The publisher had read up to `seen`: the publish deletes the two it used and returns, in the same round trip,
    the gradients newer than `seen` (at most `read_count`, oldest first), not the ones it used or had read."""
    job.policies.initialise(b"w0")
    used = [job.client.xadd(job.keys.grad, {"h": f"g{i}".encode()}).decode() for i in range(2)]
    seen = job.client.xadd(job.keys.grad, {"h": b"g2"}).decode()  # read, not used
    new = [job.client.xadd(job.keys.grad, {"h": f"g{i}".encode(), "x": b"1"}).decode() for i in (3, 4, 5)]
    lease = job.policies.acquire("param")
    before = job.client.round_trips  # type: ignore[attr-defined]
    out = job.policies.publish_and_ack(
        lease, expected_version=0, weights=b"w1", gradient_ids=used, read_after=seen, read_count=2
    )
    assert job.client.round_trips - before == 1  # type: ignore[attr-defined]
    assert out.version == 1 and out.work.gradients == 4  # g2 and the three new ones are left
    assert [(e.id, e.fields) for e in out.landed] == [
        (new[0], {b"h": b"g3", b"x": b"1"}),
        (new[1], {b"h": b"g4", b"x": b"1"}),
    ]
    assert [e.id for e in job.gradients.read(seen)] == new  # nothing deleted but the used ones
