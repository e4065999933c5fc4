"""A function whose job's data vanished from the cache under it (a Redis restarted empty, or flushed) says so in one
line, without a traceback: the control plane reports the loss, once, and resumes in a new epoch. Before, each
learner, parameter and actor instance of the dead epoch logged its own traceback (NOGROUP, "no policy yet")."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from cache import Cache, JobDataLost
from contract.runtime_http import RuntimeStatus
from functions.runtime.context import Context, Instance
from functions.runtime.handler import run_handler
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec


def test_a_handler_failing_once_its_job_s_data_is_gone_raises_job_data_lost(cache_conn: Cache, job_id: str) -> None:
    driver = Driver(cache_conn, small_spec(job_id))
    evaluate = {"job": job_id, "evaluate": {"episodes": 1, "seed": 1, "version": 99}}
    with pytest.raises(LookupError, match="nothing to evaluate") as kept:  # the data is there: the error as it was
        driver.actor(evaluate)
    assert not isinstance(kept.value, JobDataLost)
    assert driver.job.data_lost() is False

    driver.job.delete()  # what a Redis restarted without persistence leaves of the job
    assert driver.job.data_lost() is True
    with pytest.raises(JobDataLost, match=rf"job {job_id}'s data is gone from the cache") as lost:
        driver.actor({"job": job_id, "actor_id": "actor-0"})
    assert "what failed: LookupError: " in str(lost.value) and isinstance(lost.value.__cause__, LookupError)
    with pytest.raises(JobDataLost, match="what failed: VersionNotFound"):
        driver.parameter({"job": job_id, "round": 1, "wait_s": 1.0})


def test_the_runtime_logs_a_job_s_lost_data_in_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def lost(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise JobDataLost("job j1's data is gone from the cache (restarted empty, or flushed)")

    def bug(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise RuntimeError("a bug")

    ctx = Context("call-1", Instance(None))
    with caplog.at_level(logging.INFO, logger="stellaris.runtime"):
        status, body = run_handler(lost, {}, ctx)
    assert status == RuntimeStatus.HANDLER_ERROR
    assert json.loads(body)["error"]["type"] == "JobDataLost"
    [record] = caplog.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage() == "handler ended: job j1's data is gone from the cache (restarted empty, or flushed)"

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="stellaris.runtime"):
        status, body = run_handler(bug, {}, ctx)
    [record] = caplog.records  # any other error keeps its traceback
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "traceback" in json.loads(body)["error"]
