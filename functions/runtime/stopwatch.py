"""Timing a handler's compute apart from its cache I/O."""

from __future__ import annotations

import time


class Stopwatch:
    """Seconds spent inside `with watch:` blocks, summed: a handler's algorithm time, apart from its cache I/O."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0
