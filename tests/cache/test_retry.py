"""Riding out a Redis restart: the reconnect window, against a real redis-server killed with -9 and restarted."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from cache import Cache, CacheSettings
from cache.retry import RECONNECT_ENV, pause_s, window_from_env
from cache.server import EmbeddedRedis
from contract.errors import CacheError, RedisServerDied
from tests.procs import wait_pid_gone


def test_backoff_doubles_from_50_ms_up_to_1_s() -> None:
    assert [pause_s(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


@pytest.mark.parametrize(("raw", "expected"), [(None, 30.0), ("", 30.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float):
    if raw is None:
        monkeypatch.delenv(RECONNECT_ENV, raising=False)
    else:
        monkeypatch.setenv(RECONNECT_ENV, raw)
    assert window_from_env() == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "1e9"])
def test_a_bad_window_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(RECONNECT_ENV, raw)
    with pytest.raises(ValueError, match=RECONNECT_ENV):
        window_from_env()


@pytest.fixture
def aof_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(maxmemory_bytes=64 * 1024**2, appendonly=True).start()
    yield server
    server.stop()


def kill_9(server: EmbeddedRedis) -> None:
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_pid_gone(pid, 10)


def test_a_command_during_a_restart_completes_once_redis_is_back(aof_server: EmbeddedRedis) -> None:
    with Cache(CacheSettings(url=aof_server.url, reconnect_window_s=20)) as cache:
        cache.client.set("k", "before")
        kill_9(aof_server)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(cache.client.get("k")))  # issued while Redis is down
        reader.start()
        time.sleep(1.0)  # the outage
        # (restarted from this thread: the server dies with the thread that started it, cache/server.py)
        aof_server.restart()
        reader.join(timeout=20)
        assert got == [b"before"]  # answered from the AOF
        assert cache.client.incr("n") == 1  # a write after the restart, applied once
        assert cache.retry.retried > 0


def test_a_blocking_read_started_before_the_crash_resumes_after_it(aof_server: EmbeddedRedis) -> None:
    """The window counts from the first failure, not from when a long blocking read was sent."""
    with Cache(CacheSettings(url=aof_server.url, reconnect_window_s=1)) as cache:
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(cache.new_client().blpop(["q"], timeout=30)))
        reader.start()
        deadline = time.monotonic() + 10
        while cache.client.execute_command("CLIENT", "LIST").count(b"cmd=blpop") == 0:  # the read is blocked
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.5)  # longer than the window, before any failure
        kill_9(aof_server)
        aof_server.restart()
        cache.client.rpush("q", "x")
        reader.join(timeout=30)
        assert got == [(b"q", b"x")]


def test_with_the_window_at_0_the_error_surfaces_at_once(aof_server: EmbeddedRedis) -> None:
    with Cache(CacheSettings(url=aof_server.url, reconnect_window_s=0)) as cache:
        cache.client.ping()
        kill_9(aof_server)
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            cache.client.ping()
        assert cache.retry.retried == 0 and time.monotonic() - started < 5


def test_a_redis_never_reached_fails_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(CacheError, match="cannot reach Redis"):
        Cache(CacheSettings(url=f"redis://127.0.0.1:{port}/0", reconnect_window_s=30))


def test_a_dead_embedded_server_is_reported_without_waiting_out_the_window() -> None:
    with Cache(CacheSettings(reconnect_window_s=60, maxmemory_bytes=64 * 1024**2)) as cache:
        assert cache.server is not None
        kill_9(cache.server)
        started = time.monotonic()
        with pytest.raises(RedisServerDied, match="exited with code -9"):
            cache.client.ping()
        assert time.monotonic() - started < 5
