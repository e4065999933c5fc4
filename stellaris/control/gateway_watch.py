"""A watch on `stellaris train`'s gateway: asked for /healthz every `busy_probe_s`, and judged hung when it answered
none of its probes for `hung_after_s` (the gateway's own settings, gateway/settings.py `HangSettings`). A stopped or
stuck gateway keeps its connections open, so the control plane's calls through it would wait for their timeouts (an
hour). The local gateway is then killed: it drops them, and the control plane's recovery starts it again as after a
crash (`Platform.recover_gateway`). A given gateway (`--gateway-url`) is not ours to kill: the watch says that it
is silent, and when it answers again, so that a job waiting on it does not wait without a word."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

import httpx

from gateway.settings import HangSettings
from stellaris.control.probing import Watched, name_silences, probe_until_hung, to_stderr

Current = Callable[[], tuple["subprocess.Popen[str] | None", "str | None"]]


class GatewayWatch:
    """`current()` gives the gateway process (None for a given gateway: `owned` False) and URL as they are now (a
    recovery replaces both)."""

    def __init__(
        self, current: Current, hang: HangSettings, *, owned: bool = True, say: Callable[[str], None] | None = None
    ) -> None:
        self.current, self.hang, self.owned = current, hang, owned
        self.say = say or to_stderr
        self._stop = threading.Event()
        self._watched: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._watch, name="gateway-watch", daemon=True)

    def start(self) -> None:
        if self.hang.hung_after_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.hang.busy_probe_s)

    def _watch(self) -> None:
        with httpx.Client(timeout=self.hang.busy_probe_s) as client:
            if not self.owned:
                meanwhile = "the job's calls through it wait until it answers"
                watched = Watched(f"the gateway at {self.current()[1]}", "health probe", meanwhile)
                name_silences(self._stop, self.hang, lambda: self._ask(client), watched, self.say)
                return
            while (silent_s := probe_until_hung(self._stop, self.hang, lambda: self._ask(client))) is not None:
                assert self._watched is not None
                self.say(f"the local gateway answered no health probe for {silent_s:.1f} s: killing it, to start it "
                          "again")  # fmt: skip
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
