"""Which cores the process backend's instances run on. Each instance is pinned to whole cores, but only when its
first call starts: pinned by start order, an instance no call takes (a warm spare, a pre-warmed instance kept for
later) held a core's share while busy instances doubled up on another. At its first call an instance takes the
cores the fewest called instances are pinned to, and keeps them for its life; an instance that is gone frees its
share, so a replacement takes the dead one's core. Pure bookkeeping; the backend applies the cores it returns."""

from __future__ import annotations

from collections import Counter


class CorePlacement:
    def __init__(self, available: list[int]) -> None:
        self.available = sorted(available)
        self.wants: dict[str, int] = {}  # started, not yet called: how many cores each wants
        self.cores: dict[str, list[int]] = {}  # pinned at their first call

    def add(self, instance_id: str, want: int) -> None:
        """A new instance wanting `want` whole cores; it runs on any core until its first call."""
        self.wants[instance_id] = want

    def first_call(self, instance_id: str) -> list[int] | None:
        """The cores to pin an instance to as its first call starts: those the fewest pinned instances use (the
        lower on a tie). None where it is pinned already, unknown, or wants every core (then never pinned)."""
        want = self.wants.pop(instance_id, None)
        if want is None or want >= len(self.available):
            return None
        pinned = Counter(core for cores in self.cores.values() for core in cores)
        self.cores[instance_id] = sorted(sorted(self.available, key=lambda c: (pinned[c], c))[:want])
        return self.cores[instance_id]

    def forget(self, instance_id: str) -> None:
        self.wants.pop(instance_id, None)
        self.cores.pop(instance_id, None)
