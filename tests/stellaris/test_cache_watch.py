"""The control plane's cache watch: a dead embedded Redis interrupts the main thread wherever it blocks."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from cache import RedisServerDied
from cache.server import EmbeddedRedis
from stellaris.control.cache_watch import CacheWatch


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
