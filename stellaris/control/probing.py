"""The control plane's health probes of a process it owns (its local gateway, its embedded Redis): asked every
`busy_probe_s`, judged hung once it answered none for `hung_after_s` over at least two probes in a row (the gateway's
`Silence` and `HangSettings`, as for its own instances)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gateway.hung import Silence
from gateway.settings import HangSettings


def probe_until_hung(stop: threading.Event, hang: HangSettings, ask: Callable[[], bool | None]) -> float | None:
    """Probe with `ask` until `stop` is set (None) or the probed process counts as hung: then its silence in seconds.
    `ask` answers whether it answered, or None when there is nothing to probe now (a run of misses starts over)."""
    silence = Silence()
    while not stop.wait(hang.busy_probe_s):
        sent = time.monotonic()
        answered = ask()
        if answered is None:
            silence = Silence()
            continue
        silence.answered() if answered else silence.missed(sent)
        now = time.monotonic()
        if silence.hung(now, hang.hung_after_s) and not stop.is_set():
            return silence.silent_s(now)
    return None
