"""What the parameter function decides on (functions/parameter/aggregation.py), on hand-made headers: the round an
invocation may apply, the work in flight and when all is done, and the trigger between the queue and the rule."""

from __future__ import annotations

from cache.learner_registry import WorkSnapshot
from cache.streams import Entry
from cache.tasks import Landed
from contract.records import GradientMeta
from contract.triggers import ParameterTrigger
from functions.algos.stellaris import AggregationRule, AggregationState, Decision, Rule
from functions.parameter.aggregation import Queue

ASYNC, SYNC = AggregationRule(rule=Rule.ASYNC), AggregationRule(rule=Rule.SYNC)


def landed(*rounds_and_versions: tuple[int, int]) -> Landed:
    return Landed(
        [
            (Entry(f"{i + 1}-0", {}), GradientMeta("l", version, f"t{i}", round_k))
            for i, (round_k, version) in enumerate(rounds_and_versions)
        ],
        [],
    )


def test_an_invocation_sees_the_gradients_of_its_round_and_earlier_ones() -> None:
    queue = Queue(ASYNC, ParameterTrigger(), until_round=1)
    queue.add(landed((1, 0), (2, 0), (1, 0)))
    assert [gid for gid, _ in queue.visible()] == ["1-0", "3-0"] and len(queue) == 3
    assert queue.newest_round() == 1
    queue.remove(["1-0", "9-0"])  # an id it does not hold is ignored
    assert [gid for gid, _ in queue.visible()] == ["3-0"] and set(queue.entries) == {"2-0", "3-0"}
    assert Queue(ASYNC, ParameterTrigger()).newest_round() == 0


def test_the_work_in_flight_and_when_all_is_done() -> None:
    queue = Queue(ASYNC, ParameterTrigger(), until_round=1)
    queue.add(landed((2, 0)))  # a later round's: it does not keep round 1 going
    # Three tasks, two held by learners (versions 4 and 2): the third will use the newest version (5).
    assert queue.in_flight(WorkSnapshot(tasks=3, held=[4, 2], closed=1, gradients=1), 5) == ((2, 4, 5), False)
    assert queue.in_flight(WorkSnapshot(tasks=0, held=[], closed=1, gradients=1), 5) == ((), True)
    assert queue.in_flight(WorkSnapshot(tasks=0, held=[], closed=0, gradients=1), 5) == ((), False)  # not closed
    assert queue.in_flight(WorkSnapshot(tasks=0, held=[], closed=1, gradients=2), 5) == ((), False)  # one unread


def test_without_a_look_only_a_decision_to_apply_is_taken() -> None:
    queue = Queue(ASYNC, ParameterTrigger())
    assert queue.from_queue_alone and not Queue(SYNC, ParameterTrigger()).from_queue_alone
    assert not Queue(ASYNC, ParameterTrigger(gradients=2)).from_queue_alone
    assert queue.decide(AggregationState(), 3, None) is None  # nothing queued
    queue.add(landed((1, 2), (1, 3)))
    decided = queue.decide(AggregationState(), 3, None)
    assert decided is not None and decided.record.decision is Decision.AGGREGATE
    assert [gid for gid, _ in decided.used] == ["1-0"] and decided.record.stalenesses == (1, 0)  # async: one at a time


def test_the_trigger_shows_the_rule_whole_groups_and_the_rest_once_nothing_is_in_flight() -> None:
    queue = Queue(ASYNC, ParameterTrigger(gradients=2))
    queue.add(landed((1, 0)))
    assert queue.decide(AggregationState(), 0, (0,)) is None  # no group of 2 yet
    queue.add(Landed([(Entry("2-0", {}), GradientMeta("l", 0, "t2", 1))], []))
    decided = queue.decide(AggregationState(), 0, (0,))
    assert decided is not None and [gid for gid, _ in decided.used] == ["1-0"] and queue.owed == 1  # async: one
    queue.remove(gid for gid, _ in decided.used)
    decided = queue.decide(AggregationState(), 1, (0,))  # the group's other one stays visible: never split
    assert decided is not None and [gid for gid, _ in decided.used] == ["2-0"] and queue.owed == 0
    queue.remove(["2-0"])
    queue.add(Landed([(Entry("3-0", {}), GradientMeta("l", 1, "t3", 1))], []))
    assert queue.decide(AggregationState(), 2, (0,)) is None  # waits for its group
    decided = queue.decide(AggregationState(), 2, ())  # nothing in flight: what is queued is handed over
    assert decided is not None and [gid for gid, _ in decided.used] == ["3-0"]


def test_a_period_holds_the_next_firing_back() -> None:
    queue = Queue(ASYNC, ParameterTrigger(period_s=60))
    assert queue.block_s(1.0) == 1.0  # never fired: nothing to wait for
    queue.add(landed((1, 0)))
    assert queue.decide(AggregationState(), 0, (0,)) is not None
    queue.remove(["1-0"])
    queue.add(Landed([(Entry("5-0", {}), GradientMeta("l", 1, "t5", 1))], []))
    assert queue.decide(AggregationState(), 1, (1,)) is None  # within the period
    assert 0 < queue.block_s(1.0) <= 1.0 and queue.block_s(100.0) <= 60
