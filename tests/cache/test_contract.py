"""The typed contract (cache/contract): handler results, the applied log's rows and the aggregator state survive
their wire forms unchanged, and a malformed one is refused with the field named."""

from __future__ import annotations

import pytest

from cache import JobCache
from contract import (
    AggregatorState,
    AppliedGradient,
    AppliedRow,
    DecisionRow,
    LearnerResult,
    ParameterResult,
    ResultError,
)
from contract.errors import RecordError


def test_results_round_trip_through_their_dicts_and_name_a_bad_field() -> None:
    learner = LearnerResult(gradients=3, lost=1, loss_sum=1.5, truncated_sum=0.25, truncated_n=1, wait_s=0.5)
    assert LearnerResult.from_dict(learner.to_dict()) == learner
    parameter = ParameterResult(status="fenced", version=7, decisions=[DecisionRow("flush", 2, 7)])
    assert ParameterResult.from_dict(parameter.to_dict()) == parameter
    with pytest.raises(ResultError, match="gradients"):
        LearnerResult.from_dict({"gradients": "three"})
    with pytest.raises(ResultError, match="status"):
        ParameterResult.from_dict({"status": "exploded"})


def test_a_learner_result_counts_gradients_and_only_those_with_a_truncated_or_clipped_fraction() -> None:
    out = LearnerResult().with_gradient({"loss": 2.0}).with_gradient({"loss": 1.0, "truncated_fraction": 0.5})
    assert (out.gradients, out.loss_sum, out.truncated_sum, out.truncated_n) == (2, 3.0, 0.5, 1)
    out = out.with_gradient({"loss": 0.0, "clip_fraction": 0.25}).with_gradient({"clip_fraction": 0.75})
    assert (out.gradients, out.clipped_sum, out.clipped_n, out.truncated_n) == (4, 1.0, 2, 1)
    assert LearnerResult.from_dict(out.to_dict()) == out


def test_an_applied_row_reads_back_what_its_writer_wrote(job: JobCache) -> None:
    redis_client, log = job.client, job.keys.applied
    row = AppliedRow(
        version=4, decision="aggregate", round=2, threshold=None, gradients=[AppliedGradient("1-0", "t", 2, 3, 1)]
    )
    entry_id = redis_client.xadd(log, {**row.to_fields(), "version": row.version})
    [(_, raw)] = redis_client.xrange(log, entry_id, entry_id)
    assert AppliedRow.from_fields(raw) == row
    flushed = AppliedRow(version=5, decision="flush", round=2, threshold=2.5, gradients=[])
    redis_client.xadd(log, {**flushed.to_fields(), "version": 5})
    assert AppliedRow.from_fields(redis_client.xrange(log)[-1][1]) == flushed
    with pytest.raises(RecordError, match="applied"):
        AppliedRow.from_fields({b"version": b"x"})


def test_the_aggregator_state_is_stored_whole_and_a_resume_keeps_a_newer_one(job: JobCache) -> None:
    assert job.aggregator.get() == AggregatorState()
    state = AggregatorState(round_k=3, delta_max=4, aggregations=9, kl_sum=0.5, kl_n=2, kl_coef=0.3)
    job.aggregator.put(state)
    assert job.aggregator.get() == state
    assert not job.aggregator.restore(AggregatorState(round_k=1))  # the job's own state wins
    assert job.aggregator.get() == state
    job.aggregator.put(state.with_(kl_coef=None))  # a field set to None is removed
    assert job.aggregator.get().kl_coef is None
    # An older checkpoint's float strings and unknown fields still load; a non-number is named.
    assert AggregatorState.from_fields({"round_k": "2.0", "delta_max": "3.0", "gone": "1"}) == AggregatorState(2, 3)
    with pytest.raises(RecordError, match="delta_max"):
        AggregatorState.from_fields({b"delta_max": b"lots"})
