"""FIFO per actor: each actor's batches queue in arrival order (the store keeps the newest `replay_per_actor` of
each); a round replays round-robin across actors, each actor's queue from where its last replay stopped, oldest
first, wrapping around once every entry was replayed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cache.replay.pattern import ReplayPattern, Sample
from cache.replay.store import ReplayEntry, ReplayStore
from contract.replay import ReplaySettings


def fifo_choice(
    entries: Sequence[ReplayEntry], n: int, cursors: Mapping[str, int]
) -> tuple[tuple[str, ...], dict[str, int]]:
    """min(n, len(entries)) ids, round-robin over actors (sorted by id); per actor the entries after its cursor (the
    seq it last replayed) come first, then its older ones. Returns the ids and the moved cursors."""
    queues: dict[str, list[ReplayEntry]] = {}
    for e in sorted(entries, key=lambda e: e.seq):
        queues.setdefault(e.actor, []).append(e)
    for actor, q in queues.items():
        after = cursors.get(actor, 0)
        queues[actor] = [e for e in q if e.seq > after] + [e for e in q if e.seq <= after]
    out: list[str] = []
    moved = dict(cursors)
    k = min(n, len(entries))
    depth = 0
    while len(out) < k:
        for actor in sorted(queues):
            if depth < len(queues[actor]) and len(out) < k:
                e = queues[actor][depth]
                out.append(e.rid)
                moved[actor] = e.seq
        depth += 1
    return tuple(out), moved


class Fifo(ReplayPattern):
    name = "fifo"

    def __init__(self, store: ReplayStore | None, settings: ReplaySettings, *, seed: int = 0) -> None:
        super().__init__(store, settings, seed=seed)
        self.cursors: dict[str, int] = {}  # actor -> seq of its entry replayed last (control-plane memory)

    def choose(self, entries: Sequence[ReplayEntry], n: int, rng: np.random.Generator) -> Sample:
        ids, self.cursors = fifo_choice(entries, n, self.cursors)
        return Sample(ids, (1.0,) * len(ids))

    def state(self) -> dict[str, Any]:
        return {"cursors": dict(self.cursors)}

    def restore(self, saved: Mapping[str, Any]) -> None:
        self.cursors = {str(actor): int(seq) for actor, seq in (saved.get("cursors") or {}).items()}
