import time

from cache import JobCache


def test_register_reports_distinct_held_versions(job: JobCache) -> None:
    reg = job.learners
    reg.register("l1", 3)
    reg.register("l2", 5)
    reg.register("l3", 3)
    assert reg.in_flight() == {"l1": 3, "l2": 5, "l3": 3}
    assert reg.held_versions() == [3, 5]
    reg.deregister("l2")
    assert reg.held_versions() == [3]
    reg.register("l1", 6)  # re-registering moves a learner to its new version
    assert reg.in_flight() == {"l1": 6, "l3": 3}


def test_entries_of_dead_learners_expire(job: JobCache) -> None:
    job.learners.register("alive", 1, lease_s=60)
    job.learners.register("dead", 2, lease_s=0.001)
    time.sleep(0.01)  # the lease is a wall-clock deadline on the server; let it pass
    assert job.learners.in_flight() == {"alive": 1}
    assert job.client.hget(job.keys.learners, "dead") is None


def test_work_snapshot_counts_tasks_held_versions_closed_round_and_gradients(job: JobCache) -> None:
    assert job.learners.work_snapshot() == (0, [], 0, 0)  # a new job: nothing queued, no round closed
    job.learners.register("alive", 4, lease_s=60)
    job.learners.register("dead", 2, lease_s=0.001)
    job.client.xadd(job.keys.tasks, {"h": b"t1"})
    job.client.xadd(job.keys.tasks, {"h": b"t2"})
    job.client.xadd(job.keys.grad, {"h": b"g1"})
    job.board.close(3)
    time.sleep(0.01)  # let the dead learner's lease pass on the server's clock
    assert job.learners.work_snapshot() == (2, [4], 3, 1)  # the expired entry is dropped, as in_flight does
    assert job.client.hget(job.keys.learners, "dead") is None
