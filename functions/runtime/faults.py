"""Fail points for crash tests: `STELLARIS_FAULT=<point>[@N]` kills this process with SIGKILL the N-th time (default
the first) execution reaches `fault_point(<point>)`. Unset (always, outside tests), a fail point costs one dict
lookup. Points: parameter:before_publish, parameter:after_publish, learner:before_complete."""

from __future__ import annotations

import os
import signal
from collections import Counter

_ENV = "STELLARIS_FAULT"


class FailPoints:
    """Which point to fail at, and how often each was reached (per process)."""

    def __init__(self, spec: str | None) -> None:
        self.point, self.at = None, 1
        if spec:
            point, _, at = spec.partition("@")
            self.point, self.at = point, int(at or 1)
        self.reached: Counter[str] = Counter()

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        self.reached[point] += 1
        if self.reached[point] == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


_points: FailPoints | None = None


def fault_point(point: str) -> None:
    global _points
    if _points is None:  # read at the first point, not at import: a forked instance's env is set after its imports
        _points = FailPoints(os.environ.get(_ENV))
    _points.hit(point)
