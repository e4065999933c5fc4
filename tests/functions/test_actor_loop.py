import multiprocessing as mp

from cache import Cache, JobCache
from functions.actor.loop import actor_loop
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec
from tests.procs import pid_alive


def test_serverful_actor_processes_push_batches_until_stopped(cache_conn: Cache, job_id: str) -> None:
    driver = Driver(cache_conn, small_spec(job_id))
    job: JobCache = driver.job
    ctx = mp.get_context("spawn")  # no inherited locks, sockets or torch threads
    stop = ctx.Event()
    procs = [
        ctx.Process(target=actor_loop, args=(cache_conn.url, job_id, f"actor-{i}", i, stop, 3), daemon=True)
        for i in range(2)
    ]
    try:
        for p in procs:
            p.start()
        # Each actor's first batch, then nothing until the policy those batches train is published (round 1 is
        # every actor's first batch, however fast each one is).
        first = job.trajectories.take("test", count=6, block_s=60)
        while len(first) < 2:
            more = job.trajectories.take("test", count=6, block_s=60)
            assert more, "actors stopped pushing"
            first += more
        assert sorted(b.actor_id for _, b in first) == ["actor-0", "actor-1"]
        assert job.trajectories.take("test", count=6, block_s=1.0) == []
        lease = job.policies.acquire("test")
        job.policies.publish(lease, expected_version=0, weights=job.policies.get(0))
        got = list(first)
        while len(got) < 6:
            more = job.trajectories.take("test", count=6, block_s=60)
            assert more, "actors stopped pushing"
            got += more
        pids = [p.pid for p in procs]
        stop.set()
        for p in procs:
            p.join(30)
        assert sorted({b.actor_id for _, b in got}) == ["actor-0", "actor-1"]
        assert all(b.behaviour_version == 0 for _, b in first) and all(b.env_steps == 2 * 64 for _, b in got)
        assert {b.behaviour_version for _, b in got[2:]} == {1}
        assert all(pid is not None and not pid_alive(pid) for pid in pids)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        job.delete()


def test_an_actor_at_run_ahead_0_collects_its_next_batch_after_the_last_one_is_trained(
    cache_conn: Cache, job_id: str
) -> None:
    driver = Driver(cache_conn, small_spec(job_id))
    job: JobCache = driver.job
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=actor_loop, args=(cache_conn.url, job_id, "actor-0", 0, stop, 2, 0), daemon=True)
    try:
        proc.start()
        [(first_id, first)] = job.trajectories.take("test", count=2, block_s=60)
        lease = job.policies.acquire("test")
        job.policies.publish(lease, expected_version=0, weights=job.policies.get(0))
        # A newer policy alone does not start the next batch (at run-ahead 1 it would): the round still trains this one.
        assert job.trajectories.take("test", count=2, block_s=1.0) == []
        job.trajectories.ack([first_id])  # the round ends
        [(_, second)] = job.trajectories.take("test", count=2, block_s=60)
        proc.join(30)
        assert first.behaviour_version == 0 and second.behaviour_version == 1  # collected with the round's last policy
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        job.delete()
