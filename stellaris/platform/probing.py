"""The control plane's health probes of its gateway and its Redis: asked every `busy_probe_s`, judged hung once they
answered none for `hung_after_s` over at least two probes in a row (the gateway's `Silence` and `HangSettings`, as for
its own instances). Ours (a local gateway, an embedded Redis) are then killed; given ones only named."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.settings import HangSettings
from gateway.silence import Silence


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


@dataclass(frozen=True)
class Watched:
    """What a silence line names: `what` ("the gateway at URL") answered no `probe` ("health probe") for N s;
    `meanwhile`, what that does to the job."""

    what: str
    probe: str
    meanwhile: str


@dataclass(frozen=True)
class GiveUp:
    """After a silence of `after_s`, `then(silent_s)` is called once and the probing ends."""

    after_s: float
    then: Callable[[float], None]


def name_silences(
    stop: threading.Event,
    hang: HangSettings,
    ask: Callable[[], bool | None],
    watched: Watched,
    say: Callable[[str], None],
    give_up: GiveUp | None = None,
) -> None:
    """For a process that is not ours to kill (a given gateway or Redis): until `stop`, say so each time it counts as
    hung, and then when it answers again. A job waiting on it then does not wait without a word."""
    while (silent_s := probe_until_hung(stop, hang, ask)) is not None:
        say(
            f"{watched.what} answered no {watched.probe} for {silent_s:.1f} s: {watched.meanwhile} (it is not ours "
            "to restart)"
        )
        since = time.monotonic() - silent_s
        while not ask():
            if give_up is not None and (silent_s := time.monotonic() - since) >= give_up.after_s:
                give_up.then(silent_s)
                return
            if stop.wait(hang.busy_probe_s):
                return
        say(f"{watched.what} answers again, after {time.monotonic() - since:.1f} s")


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
