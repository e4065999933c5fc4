from cache import Cache, JobCache
from functions.actor_loop import ActorPool
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec
from tests.procs import pid_alive


def test_serverful_actor_processes_push_batches_until_stopped(cache_conn: Cache, job_id: str) -> None:
    driver = Driver(cache_conn, small_spec(job_id))
    job: JobCache = driver.job
    try:
        with ActorPool(cache_conn.url, job_id, 2, max_batches=3) as pool:
            got = job.trajectories.take("test", count=6, block_s=60)
            while len(got) < 6:
                more = job.trajectories.take("test", count=6, block_s=60)
                assert more, "actors stopped pushing"
                got += more
            pids = [p.pid for p in pool.processes]
        assert sorted({b.actor_id for _, b in got}) == ["actor-0", "actor-1"]
        assert all(b.behaviour_version == 0 and b.env_steps == 2 * 64 for _, b in got)
        assert all(pid is not None and not pid_alive(pid) for pid in pids)
    finally:
        job.delete()
