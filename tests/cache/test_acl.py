"""Per-job Redis users against a real Redis: a job's functions reach their own keys, Lua scripts included, and
nothing of another job's, nor any administrative command; an instance bound to a job serves no other job's events."""

from __future__ import annotations

import pytest
import redis

from cache import Cache, CacheError, CacheSettings, JobCache, LearnerTask, acl
from cache.connection import REDIS_PASSWORD_ENV, REDIS_USER_ENV, connect
from functions.handlers import EventError, job_id_of

# What lies outside a job's keys that no category of the ACL takes away (the probe of issue 58 ran each of these).
OUTSIDE = (
    ("SCAN", 0),
    ("RANDOMKEY",),
    ("DBSIZE",),
    ("MEMORY", "STATS"),
    ("SCRIPT", "FLUSH"),
    ("SCRIPT", "KILL"),
    ("PUBSUB", "CHANNELS"),
    ("SORT", "stl:{x}:list", "BY", "nosort", "GET", "stl:{other}:*"),
)


def _as(cache: Cache, job: str) -> Cache:
    """The cache as the job's own user (on a cluster: a user set on every master)."""
    grant = acl.grant_job(cache.client, job)
    return Cache(CacheSettings(url=acl.url_as(cache.url, grant.user, grant.password), reconnect_window_s=0))


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
        # (On a cluster, to one master as the job's user: a keyless command names none by itself.)
        one = mine_client.get_random_node().redis_connection if isinstance(mine_client, redis.RedisCluster) else None
        for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"), ("ACL", "LIST"), *OUTSIDE):
            with pytest.raises(redis.exceptions.NoPermissionError):
                (one or mine_client).execute_command(*command)
        assert theirs.policies.latest() == (0, b"their weights")  # untouched: SCRIPT FLUSH was refused too
        # Its own scripts still load and run (SCRIPT LOAD and EXISTS stay), as the cache's paths above did.
        sha = mine_client.script_load("return 1")
        assert mine_client.script_exists(sha) == [True] and mine_client.evalsha(sha, 0) == 1
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
    grant = acl.grant_job(cache_conn.client, job_id)
    monkeypatch.setenv("REDIS_URL", acl.url_without_credentials(cache_conn.url))  # as a gateway hands it on
    monkeypatch.setenv(REDIS_USER_ENV, grant.user)
    monkeypatch.setenv(REDIS_PASSWORD_ENV, grant.password)
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


def test_the_rules_name_only_commands_the_server_knows(cache_conn: Cache) -> None:
    """FUNCTION came with Redis 7: on 6.2 (the embedded server) the rules leave it out rather than fail the grant."""
    rules = acl.outside_rules(cache_conn.client)
    known = set(cache_conn.client.execute_command("COMMAND"))
    assert {r[1:] for r in rules if r.startswith("-")} == {c for c in acl.OUTSIDE_JOB if c in known}
    assert "-scan" in rules and "+script|load" in rules


@pytest.mark.parametrize(
    ("url", "bare"),
    [
        ("redis://:pw@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://default:p%40ss@h:1/2?password=x&db=3", "redis://h:1/2?db=3"),
        ("unix://:pw@/tmp/r.sock?db=0", "unix:///tmp/r.sock?db=0"),
        ("redis+cluster://u:pw@h:7000", "redis+cluster://h:7000"),
        ("rediss://h:6380", "rediss://h:6380"),
    ],
)
def test_an_instance_gets_the_caches_address_without_credentials(url: str, bare: str) -> None:
    assert acl.url_without_credentials(url) == bare
