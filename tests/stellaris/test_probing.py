"""The control plane's probe loop (stellaris/platform/probing.py), driven by scripted answers."""

from __future__ import annotations

import threading
import time

from gateway.settings import HangSettings
from stellaris.platform.probing import GiveUp, Watched, name_silences, probe_until_hung

HANG = HangSettings(hung_after_s=0.1, busy_probe_s=0.02)


class Script:
    """Answers `answers` in turn, then `then` for good; keeps what it answered. Sets `stop` after `stop_after`."""

    def __init__(self, *answers: bool | None, then: bool | None = False, stop_after: int = 0) -> None:
        self.answers, self.then, self.stop_after = list(answers), then, stop_after
        self.asked: list[bool | None] = []
        self.times: list[float] = []  # when each was asked
        self.stop = threading.Event()

    def __call__(self) -> bool | None:
        answer = self.answers[len(self.asked)] if len(self.asked) < len(self.answers) else self.then
        self.asked.append(answer)
        self.times.append(time.monotonic())
        if len(self.asked) == self.stop_after:
            self.stop.set()
        return answer


def test_a_silence_counts_from_the_first_miss_after_the_last_answer() -> None:
    ask = Script(True, True, False, True)  # the one miss is forgiven by the answer after it
    silent_s = probe_until_hung(ask.stop, HANG, ask)
    assert silent_s is not None and silent_s >= HANG.hung_after_s
    assert ask.asked[:4] == [True, True, False, True]
    assert len(ask.asked[4:]) >= 2 and not any(ask.asked[4:])  # judged on two misses at least


def test_nothing_to_probe_starts_the_run_of_misses_over() -> None:
    ask = Script(False, False, False, None)  # misses, then a new process that answers nothing either
    silent_s = probe_until_hung(ask.stop, HANG, ask)
    judged = time.monotonic()
    assert silent_s is not None and silent_s >= HANG.hung_after_s
    assert silent_s <= judged - ask.times[3]  # counted from the first miss after the None, not from the first


def test_a_stopped_probe_loop_judges_nothing() -> None:
    ask = Script(then=False, stop_after=3)  # silent, but stopped before it could count as hung
    assert probe_until_hung(ask.stop, HangSettings(hung_after_s=10.0, busy_probe_s=0.02), ask) is None
    assert ask.asked == [False, False, False]


def test_a_silence_past_the_give_up_ends_the_naming_after_one_call() -> None:
    ask = Script(True, then=False)  # answers once, then never again
    said: list[str] = []
    gave_up: list[float] = []
    watched = Watched("the gateway at X", "health probe", "calls wait")
    name_silences(ask.stop, HANG, ask, watched, said.append, GiveUp(0.3, gave_up.append))
    assert len(said) == 1 and said[0].startswith("the gateway at X answered no health probe for ")
    assert len(gave_up) == 1 and gave_up[0] >= 0.3  # called once, with the silence that passed the bound
    asked = len(ask.asked)
    assert not ask.stop.wait(5 * HANG.busy_probe_s) and len(ask.asked) == asked  # returned: probes no more


def test_an_answer_before_the_give_up_goes_back_to_naming() -> None:
    # Silent long enough to be named (0.1 s), then answers before the 10 s give-up, then is stopped.
    ask = Script(*[False] * 12, True, True, then=True, stop_after=16)
    said: list[str] = []
    gave_up: list[float] = []
    name_silences(ask.stop, HANG, ask, Watched("R", "PING", "calls wait"), said.append, GiveUp(10.0, gave_up.append))
    assert [line.split(" answer")[0] for line in said] == ["R", "R"] and "answers again" in said[1]
    assert gave_up == []
