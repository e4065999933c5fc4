"""Learner task records on the wire: prioritized replay's batch weights travel as a plain list of numbers in the
task's header (no pickle), and a task written without them still decodes, every batch weighing 1.0."""

from __future__ import annotations

import pytest

from contract.codec import encode_fields
from contract.errors import RecordError
from contract.records import LearnerTask


def _wire(fields: list[bytes | memoryview]) -> dict[bytes, bytes]:
    flat = [bytes(x) for x in fields]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def test_batch_weights_round_trip_one_per_batch() -> None:
    task = LearnerTask(3, ("7-0", "r2-0", "r5-0"), 1, 0, 2, batch_weights=(1.0, 0.5, 0.25))
    back = LearnerTask.from_fields(_wire(task.fields()))
    assert back == task and back.weights == (1.0, 0.5, 0.25)
    assert task.meta()["batch_weights"] == [1.0, 0.5, 0.25]


def test_a_task_without_weights_keeps_the_old_wire_format_and_weighs_one() -> None:
    old = {"kind": "task", "round": 3, "batch_ids": ["7-0", "r2-0"], "epoch": 0, "minibatch": 1, "num_minibatches": 2}
    task = LearnerTask.from_fields(_wire(encode_fields({}, old)))  # as written before the field existed
    assert task.batch_weights == () and task.weights == (1.0, 1.0)
    assert task.fields() == encode_fields({}, old)  # nothing new on the wire for unweighted tasks


@pytest.mark.parametrize(
    "weights",
    [(1.0,), (1.0, 0.0), (1.0, -0.5), (1.0, float("nan")), (1.0, float("inf"))],
)
def test_bad_batch_weights_are_a_record_error(weights: tuple[float, ...]) -> None:
    with pytest.raises(RecordError, match="positive finite weights"):
        LearnerTask(1, ("1-0", "r0-0"), 0, 0, 1, batch_weights=weights)


@pytest.mark.parametrize("weights", ["0.5", [True, 1.0], [1.0, "0.5"]])
def test_weights_that_are_not_a_list_of_numbers_do_not_decode(weights: object) -> None:
    meta = {"kind": "task", "round": 1, "batch_ids": ["1-0", "r0-0"], "epoch": 0, "minibatch": 0, "num_minibatches": 1}
    with pytest.raises(RecordError, match="batch_weights"):
        LearnerTask.from_fields(_wire(encode_fields({}, {**meta, "batch_weights": weights})))
