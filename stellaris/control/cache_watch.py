"""A dead embedded Redis ends the run at once. The job's cache died with it, so nothing is left for the functions to
finish: a thread waits on the server process and, when it dies, interrupts the control plane's main thread (SIGUSR1)
with `RedisServerDied`. Without it the run noticed only when the functions' and the gateway's reconnect windows had
run out, one after another (98 s with the default 30 s windows, measured)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from cache.server import EmbeddedRedis


class CacheWatch:
    """Armed between `start` and `stop` (the training loop); interrupts once. An external Redis is not watched (it
    may come back: the reconnect windows are for it), and neither is a run off the main thread (no handler there)."""

    def __init__(self, server: EmbeddedRedis | None) -> None:
        self.server = server
        self.armed = False
        self.lock = threading.Lock()
        self.previous: Any = None
        self.thread: threading.Thread | None = None

    def start(self) -> CacheWatch:
        if self.server is None or threading.current_thread() is not threading.main_thread():
            return self
        self.previous = signal.signal(signal.SIGUSR1, self._interrupt)
        self.armed = True
        main = threading.get_ident()
        self.thread = threading.Thread(target=self._watch, args=(self.server, main), name="cache-watch", daemon=True)
        self.thread.start()
        return self

    def _watch(self, server: EmbeddedRedis, main: int) -> None:
        if server.wait_until_dead():
            with self.lock:
                if self.armed:  # a real signal: it also ends a blocking call of the main thread (EINTR)
                    signal.pthread_kill(main, signal.SIGUSR1)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and self.server is not None:
            self.armed = False  # once: the teardown that follows runs uninterrupted
            self.server.raise_if_dead()

    def stop(self) -> None:
        with self.lock:
            self.armed = False
            if self.previous is not None:
                signal.signal(signal.SIGUSR1, self.previous)
                self.previous = None
