"""A run of unanswered health probes of one process, and when it counts as hung: the gateway's probes of its busy
instances (`gateway.hung`) and the control plane's of its local gateway and embedded Redis."""

from __future__ import annotations

from dataclasses import dataclass

MIN_MISSES = 2  # a single unanswered probe is never enough (e.g. the prober itself was starved while it waited)


@dataclass
class Silence:
    """A run of unanswered probes of one process: it counts as hung once MIN_MISSES or more in a row span
    `hung_after_s`, from the sending of the first. Also the control plane's watches on its local gateway and
    embedded Redis."""

    since: float | None = None
    misses: int = 0

    def answered(self) -> None:
        self.since, self.misses = None, 0

    def missed(self, sent: float) -> None:
        self.since = sent if self.since is None else self.since
        self.misses += 1

    def silent_s(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def hung(self, now: float, hung_after_s: float) -> bool:
        return self.misses >= MIN_MISSES and self.silent_s(now) >= hung_after_s
