"""What the parameter function's rule decides on, and its decision (no I/O): the gradients read and not yet applied,
in arrival order, and the job's trigger (docs/workflows.md) between them and the rule (`functions.algos.staleness`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from cache.gradient_feed import Landed
from cache.learner_registry import WorkSnapshot
from cache.streams import Entry
from contract.records import GradientMeta
from contract.triggers import ParameterTrigger
from functions.algos.staleness import (
    AggregationRule,
    AggregationState,
    DecisionRecord,
    QueueSnapshot,
    applies_from_queue_alone,
    decide,
)


@dataclass(frozen=True)
class Decided:
    """A decision to apply: the oldest queued gradients it takes, the rule's record, and the state it was made in."""

    used: list[tuple[str, GradientMeta]]
    record: DecisionRecord
    state: AggregationState


class Queue:
    """The gradients read and not yet applied: each one's header, which decisions use, and its entry, decoded only when
    it is aggregated. `until_round` (0: none): the invocation's round; gradients of later rounds (gradients_at_actors:
    actors run ahead) wait for their round's invocation, so a run of N rounds applies the gradients of rounds 1..N,
    whatever its actors computed ahead. The trigger shows the rule whole groups of K, the rest wait as if in flight
    (the default trigger shows it the whole queue); `owed`: the gradients of a firing the rule has not applied yet."""

    def __init__(
        self, rule: AggregationRule, trigger: ParameterTrigger, *, until_round: int = 0,
        sync_expected: int | None = None,
    ) -> None:  # fmt: skip
        self.rule, self.trigger, self.until_round, self.sync_expected = rule, trigger, until_round, sync_expected
        self.metas: dict[str, GradientMeta] = {}  # arrival order
        self.entries: dict[str, Entry] = {}
        self.owed, self.fired_at = 0, -math.inf
        # A rule that applies from the queue alone, behind the default trigger, may decide before it looks at the work
        # in flight: a round trip saved whenever it applies.
        self.from_queue_alone = applies_from_queue_alone(rule) and trigger == ParameterTrigger()

    def __len__(self) -> int:
        return len(self.metas)

    def add(self, landed: Landed) -> None:
        for entry, meta in landed.gradients:
            self.metas[entry.id], self.entries[entry.id] = meta, entry

    def remove(self, ids: Iterable[str]) -> None:
        for gid in ids:
            self.metas.pop(gid, None)
            self.entries.pop(gid, None)

    def visible(self) -> list[tuple[str, GradientMeta]]:
        """The gradients this invocation may apply: those of its round and earlier ones (all, without a round)."""
        return [(gid, m) for gid, m in self.metas.items() if not self.until_round or m.round <= self.until_round]

    def newest_round(self) -> int:
        """The newest round among the visible gradients (0 with none)."""
        return max((m.round for _, m in self.visible()), default=0)

    def in_flight(self, work: WorkSnapshot, version: int) -> tuple[tuple[int, ...], bool]:
        """Base versions of the tasks not yet turned into gradients, and whether the work is done: the round is closed
        and no task or gradient is left (but later rounds'). A task leaves the task stream only when its gradient is
        stored (or it is dead-lettered), so the stream's length counts them; tasks not (yet) held by a registered
        learner will use `version` (the newest) or a newer one."""
        held = sorted(work.held)[: work.tasks]
        later = len(self.metas) - len(self.visible())
        idle = work.tasks == 0 and work.gradients <= later and work.closed >= self.until_round
        return (*held, *([version] * (work.tasks - len(held)))), idle

    @property
    def since(self) -> float:
        """Seconds since the trigger last fired (inf before it first does)."""
        return time.monotonic() - self.fired_at

    def block_s(self, longest: float) -> float:
        """How long a wait for gradients may block: `longest`, or less until the period allows the next firing."""
        return min(longest, self.trigger.wait_s(self.since) or longest)

    def decide(self, state: AggregationState, version: int, in_flight: tuple[int, ...] | None) -> Decided | None:
        """The rule's decision on the queue behind the trigger, when it applies (else None). `in_flight`: the base
        versions of the work in flight; None: not looked at (unknown, at least one), when the rule sees the whole queue
        and only a decision to apply is acted on (the rule takes it whatever is in flight)."""
        queued = self.visible()
        versions = tuple(m.base_version for _, m in queued)
        if in_flight is None:
            seen, snapshot = len(queued), QueueSnapshot(version, versions, (version,))
        else:
            seen = self.trigger.visible(
                queued=len(queued), in_flight=len(in_flight), owed=self.owed, since_fire_s=self.since
            )
            self.fired_at = time.monotonic() if seen > self.owed else self.fired_at
            snapshot = QueueSnapshot(version, versions[:seen], in_flight + versions[seen:])
        record = decide(self.rule, state, snapshot, sync_expected=self.sync_expected)
        if in_flight is None and not record.applies:
            return None
        self.owed = seen - record.count if record.applies else seen
        return Decided(queued[: record.count], record, state) if record.applies else None
