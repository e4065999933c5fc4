"""Hung serverful actors: each actor process raises its count in the job's heartbeat hash every second
(functions/actor/loop.py `BEAT_S`) from a thread of its own, whatever its loop is doing (sampling, waiting for a
policy or for room in the queue). While the control plane waits for batches it reads the counts, and an actor whose
count did not move for `hung_after_s` of that waiting (the gateway's setting, gateway/settings.py `HangSettings`) is
taken for hung (stopped, frozen, a thread holding the GIL): the caller kills it, and it is restarted as a dead one
is. Before, one stopped actor of two held the job until the 300 s batch wait ran out and ended it.

Only time the control plane spent looking counts: looks more than `LOOK_GAP_S` apart (between rounds, a Redis
stall that held every heartbeat and this read alike) start every actor's clock again. An actor is judged only once
its own process has beaten (its field is cleared at each start), so a slow start is never taken for a hang."""

from __future__ import annotations

from dataclasses import dataclass

LOOK_GAP_S = 3.0  # looks further apart than this do not add up


@dataclass
class _Silence:
    count: int
    since: float


class ActorWatch:
    def __init__(self, hung_after_s: float) -> None:
        self.hung_after_s = hung_after_s
        self.silent: dict[str, _Silence] = {}
        self.last_look: float | None = None

    def hung(self, beats: dict[str, int], now: float) -> list[str]:
        """The actors (of those with a count in `beats`) whose count has not moved for `hung_after_s` of looking."""
        if self.hung_after_s <= 0:
            return []
        restart_clocks = self.last_look is None or now - self.last_look > LOOK_GAP_S
        self.last_look = now
        found = []
        for actor, count in beats.items():
            seen = self.silent.get(actor)
            if seen is None or seen.count != count or restart_clocks:
                self.silent[actor] = _Silence(count, now)
            elif now - seen.since >= self.hung_after_s:
                found.append(actor)
        return found

    def forget(self, actor: str) -> None:
        """Its process was (re)started: what the old one showed says nothing of the new one."""
        self.silent.pop(actor, None)

    def silent_s(self, actor: str, now: float) -> float:
        seen = self.silent.get(actor)
        return 0.0 if seen is None else now - seen.since
