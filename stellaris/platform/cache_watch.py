"""A dead embedded Redis ends the run's epoch at once. The job's cache died with it, so nothing is left for the
functions to finish: a thread waits on the server process and, when it dies, interrupts the control plane's main thread
(SIGUSR1) with `RedisServerDied`; `stellaris train` then resumes from the run's last checkpoint, as after any cache
loss (run.py). Without it the run noticed only when the functions' and the gateway's reconnect windows had run out,
one after another (98 s with the default 30 s windows, measured).

A hung one (stopped, stuck) never dies, and every call to it waits: a second thread PINGs it every `busy_probe_s` and
kills it once it answered none for `hung_after_s` (the gateway's `HangSettings`, as for the local gateway and the
actors), which the first thread then reports as a death. A given Redis (`REDIS_URL`, `--redis-url`) is PINGed at the
same pace, but never killed: its silences are named, as they start and end."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache.cluster_client import is_cluster_url, node_url
from cache.connection import redact_url
from cache.server import EmbeddedRedis
from gateway.settings import HangSettings
from stellaris.platform.probing import Watched, name_silences, probe_until_hung, to_stderr


class CacheWatch:
    """Armed between `start` and `stop` (the training loop); interrupts once. A run off the main thread is not watched
    (no handler there). A given Redis (`url`, with no `server`) may come back (the reconnect windows are for it) and is
    not ours to kill: its silences are only named, as they start and end."""

    def __init__(
        self,
        server: EmbeddedRedis | None,
        hang: HangSettings | None = None,
        *,
        url: str | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.server, self.url = server, url
        self.say = say or to_stderr
        self.hang = hang or HangSettings()
        self.armed = False
        self.lock = threading.Lock()
        self.previous: Any = None
        self.thread: threading.Thread | None = None
        self.prober: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> CacheWatch:
        if self.server is None:
            if self.url is not None and self.hang.hung_after_s > 0:
                self.prober = threading.Thread(
                    target=self._name_silences, args=(self.url,), name="cache-probe", daemon=True
                )
                self.prober.start()
            return self
        if threading.current_thread() is not threading.main_thread():
            return self
        self.previous = signal.signal(signal.SIGUSR1, self._interrupt)
        self.armed = True
        main = threading.get_ident()
        self.thread = threading.Thread(target=self._watch, args=(self.server, main), name="cache-watch", daemon=True)
        self.thread.start()
        if self.hang.hung_after_s > 0:
            self.prober = threading.Thread(target=self._probe, args=(self.server,), name="cache-probe", daemon=True)
            self.prober.start()
        return self

    def _watch(self, server: EmbeddedRedis, main: int) -> None:
        if server.wait_until_dead():
            with self.lock:
                if self.armed:  # a real signal: it also ends a blocking call of the main thread (EINTR)
                    signal.pthread_kill(main, signal.SIGUSR1)

    def _client(self, url: str) -> redis.Redis:
        """A client for PINGs: one attempt each, bounded by the probe interval (a stopped server never answers, so a
        retry would only stretch the probe). A cluster's seed node stands for it."""
        probe_s = self.hang.busy_probe_s
        url = node_url(url) if is_cluster_url(url) else url
        return redis.Redis.from_url(
            url, socket_timeout=probe_s, socket_connect_timeout=probe_s, retry=Retry(NoBackoff(), 0)
        )

    @staticmethod
    def _answers(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def _probe(self, server: EmbeddedRedis) -> None:
        with self._client(server.url) as client:

            def ask() -> bool | None:
                return self._answers(client) if server.is_alive() else None

            if (silent_s := probe_until_hung(self._stop, self.hang, ask)) is not None:
                reason = f"it answered no PING for {silent_s:.1f} s"
                self.say(f"the embedded redis-server: {reason}: killing it")
                server.kill(reason)

    def _name_silences(self, url: str) -> None:
        watched = Watched(f"the Redis at {redact_url(url)}", "PING", "the job's calls to it wait until it answers")
        with self._client(url) as client:
            name_silences(self._stop, self.hang, lambda: self._answers(client), watched, self.say)

    def raise_if_dead_or_hung(self) -> None:
        """After the job failed: `RedisServerDied` when the server died, or answers no PING now (then it is killed).
        A hung server's silence can fail a call (a timeout, a 503 from the gateway) before the probes judge it, and
        the job is then better resumed on a new one than ended. Disarms the watch: this is the one report."""
        server = self.server
        if server is None:
            return
        with self.lock:
            self.armed = False
        if server.is_alive():
            with self._client(server.url) as client:
                if not self._answers(client):
                    server.kill("it answered no PING after the job failed")
        server.raise_if_dead()

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and self.server is not None:
            self.armed = False  # once: the teardown that follows runs uninterrupted
            self.server.raise_if_dead()

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            self.armed = False
            if self.previous is not None:
                signal.signal(signal.SIGUSR1, self.previous)
                self.previous = None
        if self.prober is not None:
            self.prober.join(timeout=2 * self.hang.busy_probe_s)
