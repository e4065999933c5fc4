"""The round protocol's plan (stellaris/round/protocol.py): a round's tasks and the steps they are enqueued in.
Its runs go through the real handlers: in-process in the tests' driver (tests/functions/driver.py, used by
tests/functions/test_pipeline.py and test_learning.py) and over the gateway in tests/stellaris/test_train.py and
test_chaos.py (replaced invocations after kill -9, serverless actors in flight at once)."""

from __future__ import annotations

from stellaris.round.protocol import round_steps, round_tasks


def test_a_sync_round_is_steps_of_one_task_per_learner_and_any_other_round_one_step() -> None:
    tasks = round_tasks(3, ["b1", "b2"], epochs=2, minibatches=4)
    assert [(t.epoch, t.minibatch) for t in tasks] == [(e, i) for e in range(2) for i in range(4)]
    assert {(t.round, t.batch_ids, t.num_minibatches) for t in tasks} == {(3, ("b1", "b2"), 4)}
    assert [len(s) for s in round_steps(tasks, mode="sync", learners=3)] == [3, 3, 2]
    for mode in ("stellaris", "async", "softsync", "ssp"):
        assert round_steps(tasks, mode=mode, learners=3) == [tasks]
