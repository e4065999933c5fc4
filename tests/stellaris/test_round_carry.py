"""A replacement learner that is still starting when its round's work is done (stellaris/round/protocol.py): the
round ends without it, and the next round adopts it as one of its learners. Real handlers on a real Redis, invoked
in-process (tests/functions/driver.py); an instance's death and a replacement's cold start are played by the
functions' `invoke`: the round's first learner call dies before its handler runs, and the replacement's handler
starts only once the test lets it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cache import Cache
from contract.knobs import Rule
from functions.runtime.context import Instance
from stellaris.round.protocol import Call, Role, Rounds, RoundStats, round_tasks
from tests.functions.driver import Driver, InProcessFunctions
from tests.functions.test_pipeline import assert_exactly_once, small_spec

COLD_START_CAP_S = 10.0  # without the carry the round waits for the replacement: it then starts after this


class InstanceKilled(RuntimeError):
    pass


class ColdReplacement(InProcessFunctions):
    """Round 1's first learner invocation dies as its call arrives; the one started in its place waits for
    `warm` (its cold start) before its handler runs. Invocation serials are the protocol's holder ids' last part
    (round 1: learners .1 and .2, the parameter .3, the replacement .4)."""

    def __init__(self, home: Instance) -> None:
        super().__init__(home)
        self.warm, self.replacement_done = threading.Event(), threading.Event()
        self.learner_calls = 0
        self.warm_on_parameter_of: int | None = None  # the round whose parameter call ends the cold start

    def invoke(self, role: Role, event: dict[str, Any]) -> Call:
        holder = str(event.get("learner_id") or event.get("owner"))
        round_k, serial = (int(x) for x in holder.rsplit("-", 1)[1].split("."))
        if role == "parameter" and round_k == self.warm_on_parameter_of:
            self.warm.set()
        if role != "learner":
            return super().invoke(role, event)
        with self.lock:
            self.learner_calls += 1
        if (round_k, serial) == (1, 1):
            raise InstanceKilled("instance killed (SIGKILL)")
        if (round_k, serial) == (1, 4):
            self.warm.wait(COLD_START_CAP_S)
            try:
                return super().invoke(role, event)
            finally:
                self.replacement_done.set()
        return super().invoke(role, event)

    def died(self, exc: BaseException) -> bool:
        return isinstance(exc, InstanceKilled)

    def gone(self, exc: BaseException) -> bool:
        return isinstance(exc, InstanceKilled)


def _round(driver: Driver, rounds: Rounds) -> RoundStats:
    driver.round += 1
    ids = driver.collect()
    algo = driver.spec.algo
    stats = RoundStats()
    tasks = round_tasks(driver.round, ids, epochs=algo.num_epochs, minibatches=algo.num_minibatches)
    rounds.learn(driver.round, tasks, stats)
    driver.job.trajectories.ack(ids)
    return stats


@pytest.mark.parametrize("mode", ["stellaris", "sync"])
@pytest.mark.parametrize("warm_during", ["next_round", "between_rounds", "third_round"])
def test_a_replacement_still_starting_is_carried_into_the_next_round(
    cache_conn: Cache, job_id: str, mode: Rule, warm_during: str
) -> None:
    driver = Driver(cache_conn, small_spec(job_id), learners=2)
    functions = ColdReplacement(driver.instance)
    rounds = Rounds(driver.job, functions, mode=mode, learners=2, actors=1, enqueue_timeout_s=5.0)
    try:
        first = _round(driver, rounds)
        # Round 1 is done (the survivor computed all its tasks) while the replacement has not started.
        assert not functions.replacement_done.is_set(), "the round waited for the replacement's cold start"
        assert first.learner_restarts == 1 and len(first.learner_results) == 1
        assert len(rounds.carried) == 1
        assert_exactly_once(driver.job, 1, tasks_per_round=8)

        if warm_during == "between_rounds":
            # It comes up before round 2's tasks are in, finds round 1 done and leaves: a new call takes its place.
            functions.warm.set()
            assert functions.replacement_done.wait(30)
        else:  # it comes up as round 2's (or round 3's) tasks are enqueued
            functions.warm_on_parameter_of = 2 if warm_during == "next_round" else 3
        second = _round(driver, rounds)
        assert second.learner_restarts == 0
        if warm_during == "third_round":  # still starting: round 2 did not wait for it either
            assert not functions.replacement_done.is_set(), "round 2 waited for the adopted one's cold start"
            assert len(second.learner_results) == 1 and len(rounds.carried) == 1
        elif warm_during == "between_rounds":  # adopted, done at once, and replaced: 3 results, 2 new calls
            assert (len(second.learner_results), functions.learner_calls) == (3, 5)
        elif mode == "stellaris":  # adopted as one of round 2's two learners: 1 new call
            assert functions.learner_calls == 4
        if warm_during == "next_round":
            # The round does not wait for an adopted call to return (it may still be leaving its lease): the cache
            # is checked once it has.
            assert functions.replacement_done.wait(30)
        assert_exactly_once(driver.job, 2, tasks_per_round=8)

        third = _round(driver, rounds)
        assert functions.replacement_done.wait(30)
        assert_exactly_once(driver.job, 3, tasks_per_round=8)
        # Every call that ran is reported once, by the round that saw it end, or is carried on still: none is lost.
        rounds_stats = (first, second, third)
        reported = sum(len(s.learner_results) + s.learner_restarts for s in rounds_stats)
        assert reported + len(rounds.carried) == functions.learner_calls
    finally:
        functions.warm.set()
        rounds.close()
        driver.job.delete()
