"""Per-job Redis users against a real Redis: a job's functions reach their own keys, Lua scripts included, and
nothing of another job's, nor any administrative command; an instance bound to a job serves no other job's events."""

from __future__ import annotations

import pytest
import redis

from cache import Cache, CacheError, CacheSettings, JobCache, LearnerTask, acl
from cache.connection import REDIS_PASSWORD_ENV, REDIS_USER_ENV, connect
from functions.handlers import EventError, job_id_of


def _as(cache: Cache, job: str) -> Cache:
    """The cache as the job's own user (on a cluster: a user set on every master)."""
    user, password = acl.grant_job(cache.client, job)
    return Cache(CacheSettings(url=acl.url_as(cache.url, user, password), reconnect_window_s=0))


def test_a_job_user_reaches_its_own_keys_and_no_other_jobs(cache_conn: Cache, job_id: str) -> None:
    assert acl.supported(cache_conn.client)
    other = f"{job_id}-b"
    theirs = JobCache(cache_conn.client, other)
    theirs.policies.initialise(b"their weights")
    mine_cache = _as(cache_conn, job_id)
    mine_client = mine_cache.client
    try:
        mine = JobCache(mine_client, job_id)
        # The cache's own paths, Lua scripts among them, work on the job's keys.
        assert mine.policies.initialise(b"w0") == 0
        mine.board.enqueue([LearnerTask(1, ("b1",), 0, 0, 1)], close_round=1, timeout_s=5)
        claim = mine.board.claim("learner-1")
        assert claim.task is not None and claim.weights == b"w0"
        # Another job's keys: refused, by command and from inside a script (a key the script does not declare).
        denied = JobCache(mine_client, other)
        with pytest.raises(redis.exceptions.NoPermissionError):
            denied.policies.latest()
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine_client.set(theirs.keys.policy_version, 99)
        with pytest.raises(redis.ResponseError, match="can't access"):
            mine_client.eval("return redis.call('GET', ARGV[1])", 0, theirs.keys.policy_version)
        for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"), ("ACL", "LIST")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                mine_client.execute_command(*command)
        assert theirs.policies.latest() == (0, b"their weights")  # untouched
    finally:
        mine_cache.close()
        acl.revoke_job(cache_conn.client, job_id)
        theirs.delete()
        JobCache(cache_conn.client, job_id).delete()
    with pytest.raises(CacheError, match="invalid username-password pair"):  # a revoked user is gone
        Cache(CacheSettings(url=acl.url_as(cache_conn.url, acl.job_user(job_id), "x"), reconnect_window_s=0))


def test_instance_credentials_apply_over_the_deployments_url(
    cache_conn: Cache, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    user, password = acl.grant_job(cache_conn.client, job_id)
    monkeypatch.setenv("REDIS_URL", cache_conn.url)
    monkeypatch.setenv(REDIS_USER_ENV, user)
    monkeypatch.setenv(REDIS_PASSWORD_ENV, password)
    try:
        with connect() as cache:
            cache.client.set(f"stl:{{{job_id}}}:probe", 1)  # as the job's user: its own keys only
            with pytest.raises(redis.exceptions.NoPermissionError):
                cache.client.set("stl:{someone-else}:probe", 1)
    finally:
        acl.revoke_job(cache_conn.client, job_id)
        cache_conn.client.delete(f"stl:{{{job_id}}}:probe")


def test_an_instance_bound_to_a_job_serves_only_that_job(monkeypatch: pytest.MonkeyPatch) -> None:
    assert job_id_of({"job": "a"}) == "a"  # unbound: the event says
    monkeypatch.setenv(acl.JOB_ENV, "a")
    assert job_id_of({}) == "a" and job_id_of({"job": "a"}) == "a"
    with pytest.raises(EventError, match="serves job 'a' only; the event names 'b'"):
        job_id_of({"job": "b"})
