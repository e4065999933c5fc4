"""The round protocol (stellaris/control/rounds.py) with stand-in functions on a real Redis: how it plans a round's
steps, replaces failed invocations, and invokes serverless actors. (Its runs with the real handlers: the tests'
driver, tests/functions/driver.py, in tests/functions/test_pipeline.py.)"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from cache import JobCache
from stellaris.control.rounds import Call, Role, Rounds, RoundStats, TrainingError, round_steps, round_tasks


class Died(RuntimeError):
    """What a stand-in raises for an instance that died (the gateway's 502/504)."""


class Scripted:
    """Stand-in functions: each role's calls answer from a script (a result, an exception to raise, or a callable
    run with the event), then with the role's default; every event is recorded."""

    def __init__(self, **scripts: list[Any]) -> None:
        self.scripts = {role: list(s) for role, s in scripts.items()}
        self.events: list[tuple[Role, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def invoke(self, role: Role, event: dict[str, Any]) -> Call:
        with self.lock:
            self.events.append((role, event))
            script = self.scripts.get(role) or []
            answer = script.pop(0) if script else None
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            answer = answer(event)
        return Call(answer or default(role, event), 0.001)

    def died(self, exc: BaseException) -> bool:
        return isinstance(exc, Died)


def default(role: Role, event: dict[str, Any]) -> dict[str, Any]:
    if role == "actor":
        return {"batch_id": f"b-{event['actor_index']}", "version": 0, "env_steps": 8, "episode_returns": [1.0]}
    if role == "learner":
        return {"status": "done", "gradients": 2, "loss_sum": 1.0}
    return {"status": "ok", "version": 1, "decisions": [{"decision": "aggregate", "count": 2, "version": 1}]}


def test_a_sync_round_is_steps_of_one_task_per_learner_and_any_other_round_one_step() -> None:
    tasks = round_tasks(3, ["b1", "b2"], epochs=2, minibatches=4)
    assert [(t.epoch, t.minibatch) for t in tasks] == [(e, i) for e in range(2) for i in range(4)]
    assert {(t.round, t.batch_ids, t.num_minibatches) for t in tasks} == {(3, ("b1", "b2"), 4)}
    assert [len(s) for s in round_steps(tasks, mode="sync", learners=3)] == [3, 3, 2]
    for mode in ("stellaris", "async", "softsync", "ssp"):
        assert round_steps(tasks, mode=mode, learners=3) == [tasks]


def test_serverless_actors_run_all_at_once_on_their_own_pool_beyond_the_learner_count(job: JobCache) -> None:
    """Six actor calls that each wait for all six to be in flight: before, actors shared the learner pool (and were
    invoked one after another), so they could never all be running at once."""
    at_once = threading.Barrier(6, timeout=20)

    def meet(event: dict[str, Any]) -> dict[str, Any]:
        at_once.wait()
        return default("actor", event)

    functions = Scripted(actor=[meet] * 6)
    rounds = Rounds(job, functions, mode="stellaris", learners=1, actors=6)
    try:
        stats = RoundStats()
        results = rounds.invoke_actors(6, stats)
    finally:
        rounds.close()
    assert [r.batch_id for r in results] == [f"b-{i}" for i in range(6)]  # in actor order
    assert stats.actor_restarts == 0 and len(stats.actor_results) == 6


def test_an_actor_call_whose_instance_died_is_made_again_and_a_bug_is_raised(job: JobCache) -> None:
    functions = Scripted(actor=[Died("502"), default("actor", {"actor_index": 0})])
    rounds = Rounds(job, functions, mode="stellaris", learners=1, actors=1)
    try:
        stats = RoundStats()
        assert [r.batch_id for r in rounds.invoke_actors(1, stats)] == ["b-0"]
        assert stats.actor_restarts == 1
        rounds.functions = Scripted(actor=[KeyError("a bug")])
        with pytest.raises(KeyError):
            rounds.invoke_actors(1, RoundStats())
    finally:
        rounds.close()


def test_failed_learner_and_parameter_invocations_are_replaced_and_results_read_as_records(job: JobCache) -> None:
    functions = Scripted(
        learner=[{"status": "timeout"}, Died("504")],
        parameter=[{"status": "busy", "decisions": []}, Died("502")],
    )
    rounds = Rounds(job, functions, mode="stellaris", learners=2, actors=1)
    tasks = round_tasks(1, ["b-0"], epochs=1, minibatches=4)
    stats = RoundStats()
    try:
        rounds.learn(1, tasks, stats)
    finally:
        rounds.close()
    calls = Counter(role for role, _ in functions.events)
    assert calls == {"learner": 4, "parameter": 3}  # 2 + 2 replacements; 1 + 2 replacements
    assert (stats.learner_restarts, stats.parameter_restarts, stats.max_in_flight) == (2, 2, 2)
    assert [r.gradients for r in stats.learner_results] == [2, 2]
    assert [r.status for r in stats.parameter_results] == ["ok"]
    assert stats.parameter_results[0].decisions[0].count == 2
    assert all(event == {"job": job.keys.job, "round": 1} for _, event in functions.events)
    assert job.board.outstanding() == 4  # all enqueued in one step (the stand-ins take none)


def test_a_round_with_too_many_failed_invocations_gives_up(job: JobCache) -> None:
    functions = Scripted(learner=[Died("502")] * 100)
    rounds = Rounds(job, functions, mode="stellaris", learners=1, actors=1)
    try:
        with pytest.raises(TrainingError, match="function invocations failed in round 1"):
            rounds.learn(1, round_tasks(1, ["b-0"], epochs=1, minibatches=1), RoundStats())
    finally:
        rounds.close()


def test_learner_invocations_started_elsewhere_leave_the_protocol_one_parameter_call(job: JobCache) -> None:
    functions = Scripted()
    rounds = Rounds(job, functions, mode="stellaris", learners=3, actors=1, invocations=0)
    try:
        rounds.learn(1, round_tasks(1, ["b-0"], epochs=1, minibatches=2), RoundStats())
    finally:
        rounds.close()
    assert [role for role, _ in functions.events] == ["parameter"]
