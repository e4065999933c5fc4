"""A script call sent now and read later (`cache.deferred`), against a real Redis: the reply read after other work,
a script the server lost, a connection lost before the reply was read, a script's own error, and a learner's
claim sent ahead while the gradient stream is full."""

import threading

import pytest
import redis
import torch

from cache import Cache, CacheSettings, GradientMeta, GradientRecord, JobCache, JobLimits, LearnerTask
from cache.deferred import Deferred
from cache.server import EmbeddedRedis

COUNT = "local n = redis.call('INCR', KEYS[1]) return {n, ARGV[1]}"


@pytest.fixture
def single(redis_server: EmbeddedRedis):
    """A cache of its own on the single server: these tests kill its connections."""
    with Cache(CacheSettings(url=redis_server.url)) as cache:
        yield cache


def test_the_reply_is_read_after_other_commands_and_the_connection_goes_back(cache_conn: Cache, job_id: str) -> None:
    client = cache_conn.client
    script = client.register_script(COUNT)
    key = f"stl:{{{job_id}}}:n"
    assert script(keys=[key], args=["loads it"]) == [1, b"loads it"]
    trips = cache_conn.round_trips
    call = Deferred(client, script, [key], [b"x" * 40_000])
    assert call.pending == isinstance(client, redis.Redis)  # a cluster client makes the call at once
    client.set(f"stl:{{{job_id}}}:other", 1)  # the client goes on meanwhile, on another connection
    assert call.result() == [2, b"x" * 40_000]
    assert not call.pending and call.result() == [2, b"x" * 40_000]  # read once
    assert cache_conn.round_trips - trips == 2
    assert int(client.get(key)) == 2
    client.delete(key, f"stl:{{{job_id}}}:other")
    if isinstance(client, redis.Redis):
        assert not client.connection_pool._in_use_connections  # no connection kept back


def test_a_script_the_server_lost_is_loaded_and_run_once(single: Cache, job_id: str) -> None:
    client = single.client
    script = client.register_script(COUNT)
    key = f"stl:{{{job_id}}}:n"
    client.script_flush()
    call = Deferred(client, script, [key], ["a"])
    assert call.result() == [1, b"a"]  # NOSCRIPT: nothing ran, so it runs once
    assert int(client.get(key)) == 1
    client.delete(key)


def test_a_connection_lost_before_the_reply_was_read_runs_the_call_again(single: Cache, job_id: str) -> None:
    """As a call whose reply was lost: the server ran it, and it runs again (the hot-path scripts are written so
    that this repeats nothing); the caller gets the second reply and the client stays usable."""
    client = single.client
    script = client.register_script(COUNT)
    key = f"stl:{{{job_id}}}:n"
    call = Deferred(client, script, [key], ["a"])
    assert call.pending
    while client.get(key) is None:  # the server ran it (the reply is on its way)
        pass
    call._conn.disconnect()  # the connection is lost before the reply is read
    assert call.result() == [2, b"a"]
    assert int(client.get(key)) == 2
    client.delete(key)


def test_a_scripts_own_error_is_raised_and_the_connection_stays_usable(cache_conn: Cache, job_id: str) -> None:
    client = cache_conn.client
    script = client.register_script("return redis.error_reply('FENCE not yours')")
    call = Deferred(client, script, [f"stl:{{{job_id}}}:n"], [])
    for _ in range(2):  # raised again if asked again
        with pytest.raises(redis.ResponseError, match="FENCE not yours"):
            call.result()
    assert client.ping()


def test_a_claim_sent_ahead_into_a_full_gradient_stream_waits_for_room(cache_conn: Cache, job_id: str) -> None:
    job = JobCache(cache_conn.client, job_id, JobLimits(gradient_maxlen=1))
    try:
        job.policies.initialise(b"w0")
        board = job.board
        ids = board.enqueue([LearnerTask(1, ("0-1",), 0, i, 3) for i in range(3)], close_round=1, timeout_s=1)

        def grad(tid: str) -> tuple[str, GradientRecord]:
            return tid, GradientRecord(GradientMeta("a", 0, tid, 1), {"w": torch.ones(2)})

        assert board.claim("a").task.id == ids[0]
        stored = board.send_claim("a", held_version=0, finished=grad(ids[0]), holding=None).result()
        assert stored.stored is not None and stored.task.id == ids[1]  # the stream is full now
        pending = board.send_claim("a", held_version=0, finished=grad(ids[1]), holding=None, timeout_s=30)

        def make_room() -> None:  # as the parameter function does once it has applied a gradient
            job.client.xdel(job.keys.grad, stored.stored)
            job.client.lpush(job.keys.freed(job.keys.grad), "1")

        freed = threading.Timer(0.3, make_room)
        freed.start()
        claim = pending.result()  # "full": nothing stored or claimed until the parameter function makes room
        freed.join()
        assert claim.stored is not None and claim.task is not None and claim.task.id == ids[2]
        assert [job.gradients.meta(e).task_id for e in job.gradients.read()] == [ids[1]]
    finally:
        job.delete()
