"""Worker processes for the cache tests: `python -m tests.cache.workers ROLE URL JOB [ARGS]`."""

from __future__ import annotations

import sys

from cache import Cache, CacheSettings, JobCache, JobLimits


def publisher(job: JobCache, owner: str, count: int) -> None:
    """Publish `count` versions through the lease protocol; print each version this process published."""
    for _ in range(count):
        lease = job.policies.acquire(owner, lease_s=10.0, wait_s=60.0)
        try:
            current = job.policies.version()
            assert current is not None
            new = job.policies.publish(lease, expected_version=current, weights=f"{owner}".encode())
            print(new, flush=True)
        finally:
            job.policies.release(lease)


def doomed_consumer(job: JobCache, consumer: str) -> None:
    """Take one batch, report its id, then hang until killed (never acks)."""
    taken = job.trajectories.take(consumer, block_s=30.0)
    print(taken[0][0], flush=True)
    sys.stdin.read()


def task_holder(job: JobCache, learner: str) -> None:
    """Claim one task and keep its lease fresh, report the task id, then hang until killed (never stores)."""
    with job.board.leased(learner):
        claim = job.board.claim(learner)
        assert claim.task is not None
        print(claim.task.id, flush=True)
        sys.stdin.read()


def owner() -> None:
    """Own an embedded server: print its pid, then wait on stdin (SIGINT or SIGKILL end this process)."""
    from cache import connect

    with connect(None) as cache:
        assert cache.server is not None
        print(cache.server.pid, flush=True)
        sys.stdin.read()


def main() -> None:
    if sys.argv[1] == "own":
        owner()
        return
    role, url, job_id, *rest = sys.argv[1:]
    with Cache(CacheSettings(url=url)) as cache:
        job = JobCache(cache.client, job_id, JobLimits())
        if role == "publish":
            publisher(job, rest[0], int(rest[1]))
        elif role == "consume":
            doomed_consumer(job, rest[0])
        elif role == "hold-task":
            task_holder(job, rest[0])
        else:
            raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
