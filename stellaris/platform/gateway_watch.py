"""A watch on `stellaris train`'s gateway: asked for /healthz every `busy_probe_s`, and judged hung when it answered
none of its probes for `hung_after_s` (the gateway's own settings, gateway/settings.py `HangSettings`). A stopped or
stuck gateway keeps its connections open, so the control plane's calls through it would wait for their timeouts (an
hour). The local gateway is then killed: it drops them, and the control plane's recovery starts it again as after a
crash (`Platform.recover_gateway`). A given gateway (`--gateway-url`) is not ours to kill: the watch says that it
is silent, and when it answers again, so that a job waiting on it does not wait without a word. Silent for `give_up_s`
(as long as a job waits for a given gateway that went away), it ends the job: the main thread is interrupted
(SIGUSR2) with `GatewayStuck`, and the CLI's exit leaves the calls still waiting on it behind."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import httpx

from gateway.settings import HangSettings
from stellaris.platform.probing import GiveUp, Watched, name_silences, probe_until_hung, to_stderr

Current = Callable[[], tuple["subprocess.Popen[str] | None", "str | None"]]


class GatewayStuck(RuntimeError):
    """A given gateway answered no health probe for the watch's `give_up_s`: the job ends, as for one that went away."""


class GatewayWatch:
    """`current()` gives the gateway process (None for a given gateway: `owned` False) and URL as they are now (a
    recovery replaces both). A given gateway's job is ended only when the watch starts on the main thread (the one a
    signal reaches) with a `give_up_s`."""

    def __init__(
        self,
        current: Current,
        hang: HangSettings,
        *,
        owned: bool = True,
        say: Callable[[str], None] | None = None,
        give_up_s: float | None = None,
    ) -> None:
        self.current, self.hang, self.owned = current, hang, owned
        self.say = say or to_stderr
        self.give_up_s = give_up_s
        self._stop = threading.Event()
        self._watched: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._watch, name="gateway-watch", daemon=True)
        self._lock = threading.RLock()  # re-entrant: the handler runs on the main thread, which may hold it (stop)
        self._main: int | None = None  # the thread to interrupt, while armed
        self._previous: Any = None
        self._reason = ""

    def start(self) -> None:
        if self.hang.hung_after_s <= 0:
            return
        if not self.owned and self.give_up_s and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR2, self._interrupt)
            self._main = threading.get_ident()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._main = None  # disarmed: the teardown that follows runs uninterrupted
            if self._previous is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGUSR2, self._previous)
                self._previous = None
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.hang.busy_probe_s)

    def _watch(self) -> None:
        with httpx.Client(timeout=self.hang.busy_probe_s) as client:
            if not self.owned:
                give_up = GiveUp(self.give_up_s, self._give_up) if self._main is not None and self.give_up_s else None
                meanwhile = "the job's calls through it wait until it answers"
                meanwhile += f", for {give_up.after_s:g} s at most" if give_up is not None else ""
                watched = Watched(f"the gateway at {self.current()[1]}", "health probe", meanwhile)
                name_silences(self._stop, self.hang, lambda: self._ask(client), watched, self.say, give_up)
                return
            while (silent_s := probe_until_hung(self._stop, self.hang, lambda: self._ask(client))) is not None:
                assert self._watched is not None
                self.say(
                    f"the local gateway answered no health probe for {silent_s:.1f} s: killing it, to start it again"
                )
                self._watched.kill()

    def _ask(self, client: httpx.Client) -> bool | None:
        """Whether the gateway of now answered /healthz; None when the local one is gone (the next request brings it
        back) or was started again (a new run of probes)."""
        proc, url = self.current()
        if self.owned:
            if proc is not self._watched:
                self._watched = proc
                return None
            if proc is None or proc.poll() is not None:
                return None
        if url is None:
            return None
        try:
            return client.get(f"{url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def _give_up(self, silent_s: float) -> None:
        with self._lock:
            if self._main is not None:
                self._reason = (
                    f"the gateway at {self.current()[1]} answered no health probe for {silent_s:.0f} s: ending the "
                    "job, as for a gateway away that long"
                )
                # A real signal: it also ends a blocking call of the main thread (a call waiting on the gateway).
                signal.pthread_kill(self._main, signal.SIGUSR2)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            if self._main is None or not self._reason:  # disarmed, or a SIGUSR2 not of ours: nothing to end
                return
            self._main = None  # once
        raise GatewayStuck(self._reason)
