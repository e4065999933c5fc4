"""The control plane's cache watch: a dead embedded Redis interrupts the main thread wherever it blocks, and a hung one
(SIGSTOP) is killed once it answered no PING for `hung_after_s`, then reported as dead."""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Iterator

import pytest

from cache import RedisServerDied
from cache.server import EmbeddedRedis
from gateway.settings import HangSettings
from stellaris.platform.cache_watch import CacheWatch
from tests.procs import wait_pid_gone

QUICK = HangSettings(hung_after_s=1.0, busy_probe_s=0.25)


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as s:
        yield s


def test_a_killed_server_interrupts_a_blocked_main_thread_with_its_log_tail(server: EmbeddedRedis) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    watch = CacheWatch(server).start()
    assert signal.getsignal(signal.SIGUSR1) != before
    never = threading.Event()
    try:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        with pytest.raises(RedisServerDied, match=r"(?s)exited with code -9.*Ready to accept connections"):
            never.wait(60)  # nothing sets it: only the watch's signal ends this wait
    finally:
        watch.stop()
    assert signal.getsignal(signal.SIGUSR1) == before  # the previous handler is back


def test_a_stopped_watch_and_a_server_stopped_on_purpose_interrupt_nothing(server: EmbeddedRedis) -> None:
    watch = CacheWatch(server).start()
    watch.stop()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    assert watch.thread is not None
    watch.thread.join(30)  # the watcher saw the death and, disarmed, sent nothing (a signal would raise here)
    assert not watch.thread.is_alive()

    with EmbeddedRedis() as other:
        watch = CacheWatch(other).start()
        other.stop()  # the end of a run: not a death
        assert watch.thread is not None
        watch.thread.join(30)
        assert not watch.thread.is_alive()
        watch.stop()


def test_an_external_redis_is_not_watched() -> None:
    watch = CacheWatch(None).start()
    assert watch.thread is None
    watch.stop()


def test_a_stopped_server_is_killed_as_hung_and_interrupts_the_main_thread_saying_so(server: EmbeddedRedis) -> None:
    watch = CacheWatch(server, QUICK).start()
    never = threading.Event()
    pid = server.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RedisServerDied) as died:
            never.wait(60)  # only the watch's signal ends this wait
    finally:
        watch.stop()
    assert wait_pid_gone(pid, 10)
    assert died.value.headline.startswith(f"embedded redis-server (pid {pid}, port {server.port}) was killed (it ")
    assert "answered no PING for " in died.value.headline and died.value.headline.endswith("exited with code -9")
    assert "Ready to accept connections" in died.value.log_tail


def test_a_server_that_answers_is_never_killed(server: EmbeddedRedis) -> None:
    """Six times `hung_after_s` of probes, with the server busy serving another client all along."""
    import redis

    watch = CacheWatch(server, QUICK).start()
    try:
        with redis.Redis.from_url(server.url) as client:
            for i in range(600):
                client.set(f"k{i}", b"x" * 100_000)
                threading.Event().wait(0.01)
        assert server.is_alive()
        assert watch.prober is not None and watch.prober.is_alive()
    finally:
        watch.stop()
    assert watch.prober is not None and not watch.prober.is_alive()  # stop() ends the probes


def test_after_a_failure_a_silent_server_is_killed_and_reported_and_an_answering_one_is_not(
    server: EmbeddedRedis,
) -> None:
    """The job failed (a call timed out, say) before the probes judged the server: one PING decides."""
    off = HangSettings(hung_after_s=0, busy_probe_s=0.25)  # no probes: only the check after the failure
    watch = CacheWatch(server, off).start()
    try:
        assert watch.prober is None
        watch.raise_if_dead_or_hung()  # it answers: nothing to report, and it lives
        assert server.is_alive()
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RedisServerDied, match=r"was killed \(it answered no PING after the job failed\)"):
            watch.raise_if_dead_or_hung()
        assert wait_pid_gone(pid, 10)
    finally:
        watch.stop()


def test_a_given_redis_that_stops_answering_is_named_never_killed_and_so_is_its_return() -> None:
    with EmbeddedRedis() as given:  # given: the watch knows only its URL
        said: queue.Queue[str] = queue.Queue()
        watch = CacheWatch(None, QUICK, url=given.url, say=said.put).start()
        assert given.pid is not None
        try:
            os.kill(given.pid, signal.SIGSTOP)
            line = said.get(timeout=30)
            assert line.startswith("the Redis at redis://") and "answered no PING for " in line and "not ours" in line
            assert given.password not in line
            os.kill(given.pid, signal.SIGCONT)
            assert " answers again, after " in said.get(timeout=30) and given.is_alive()
        finally:
            watch.stop()
            os.kill(given.pid, signal.SIGCONT)
        assert said.empty()
