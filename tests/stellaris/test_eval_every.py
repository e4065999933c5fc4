"""Periodic deterministic evaluation (`eval_every`, `eval_episodes`): a short real CartPole run fills eval_reward_*
in the rounds due and the last, through metered actor-function invocations; an evaluation that fails costs its
round the columns, never the run."""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cache import Cache
from experiments.summary import final_eval_reward, read_info
from functions.runtime.context import Context, Instance
from stellaris.evaluate import evaluate_run
from stellaris.plots import run_curve
from stellaris.round.evaluation import EVAL_SEED_OFFSET, Evaluator
from stellaris.round.protocol import Call, Role
from tests.functions.driver import HANDLERS, Driver
from tests.functions.test_pipeline import small_spec
from tests.stellaris.test_train import rows, run_train, train_cmd

EPISODES = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three rounds evaluated every second round: round 2 is due, round 3 is the last."""
    tmp = tmp_path_factory.mktemp("eval")
    out = tmp / "run"
    cmd = train_cmd(tmp, "--rounds", "3", "--out", str(out), eval_every=2, eval_episodes=EPISODES, seed=5)
    proc = run_train(cmd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_rounds_due_and_the_last_are_evaluated_with_whole_episodes(run_dir: Path) -> None:
    info = rows(run_dir / "info.csv")
    assert [int(r["eval_episodes"]) for r in info] == [0, EPISODES, EPISODES]
    assert all(math.isnan(float(info[0][f"eval_reward_{s}"])) for s in ("max", "mean", "min", "std"))
    for r in info[1:]:
        low, mean, high = (float(r[f"eval_reward_{s}"]) for s in ("min", "mean", "max"))
        # CartPole pays 1 a step and ends by 500 steps: whole-episode returns are whole numbers in [1, 500]
        assert 1 <= low <= mean <= high <= 500 and low == int(low) and high == int(high)
    # The last evaluation ran the run's final policy: `stellaris eval` of policy.safetensors with the evaluation's
    # seed (its default) plays the same episodes.
    returns = evaluate_run(run_dir, episodes=EPISODES)
    assert returns == evaluate_run(run_dir, episodes=EPISODES, seed=5 + EVAL_SEED_OFFSET)
    last = info[-1]
    assert (max(returns), sum(returns) / EPISODES, min(returns)) == pytest.approx(
        (float(last["eval_reward_max"]), float(last["eval_reward_mean"]), float(last["eval_reward_min"])), abs=1e-9
    )


def test_evaluations_are_metered_invocations_and_tensorboard_points(run_dir: Path) -> None:
    evaluations = [r for r in rows(run_dir / "invocations.csv") if r["function"].endswith("-actor")]
    assert len(evaluations) == 2  # serverful actors make no calls: these are the two evaluations
    assert all(float(r["cost"]) > 0 and r["device"] == "cpu" for r in evaluations)
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    info = rows(run_dir / "info.csv")
    points = acc.Scalars("eval/return_mean")
    assert [p.step for p in points] == [2, 3]  # no point for the round without an evaluation
    assert [p.value for p in points] == pytest.approx([float(r["eval_reward_mean"]) for r in info[1:]], rel=1e-6)


def test_curve_and_summary_carry_the_evaluations(run_dir: Path) -> None:
    info = rows(run_dir / "info.csv")
    curve = run_curve(run_dir)
    assert list(curve["eval_env_steps"]) == [float(r["env_steps"]) for r in info[1:]]
    assert list(curve["eval_return"]) == pytest.approx([float(r["eval_reward_mean"]) for r in info[1:]])
    assert len(curve["return"]) == sum(1 for r in info if not math.isnan(float(r["train_reward_mean"] or "nan")))
    assert final_eval_reward(read_info(run_dir)) == pytest.approx(float(info[-1]["eval_reward_mean"]))


class HandlerCalls:
    """The round protocol's `Functions` as in-process handler calls on one instance (a handler's exception is a bug,
    never a dead instance), as the tests' driver makes them."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance

    def invoke(self, role: Role, event: dict[str, Any]) -> Call:
        return Call(HANDLERS[role](event, Context(uuid.uuid4().hex[:12], self.instance)), 0.0)

    def died(self, exc: BaseException) -> bool:
        return False

    def gone(self, exc: BaseException) -> bool:
        return False


def test_a_failed_evaluation_leaves_nan_and_a_warning(
    cache_conn: Cache, job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The product's Evaluator on the actor handler (in-process): a version the store no longer keeps fails the
    call, which the round survives."""
    driver = Driver(cache_conn, small_spec(job_id))
    try:
        evaluator = Evaluator(HandlerCalls(driver.instance), job_id, every=1, episodes=2, seed=0)
        columns, _ = evaluator.evaluate(1, 0)
        assert columns["eval_episodes"] == 2 and columns["eval_reward_min"] >= 1
        with caplog.at_level(logging.WARNING, logger="stellaris.train"):
            columns, _ = evaluator.evaluate(4, 99)
        assert columns["eval_episodes"] == 0 and math.isnan(columns["eval_reward_mean"])
        assert "round 4: evaluation failed" in caplog.text and "policy version 99" in caplog.text
    finally:
        driver.job.delete()


def test_evaluation_is_due_every_n_rounds_and_at_the_last() -> None:
    due = Evaluator(None, "j", every=3, episodes=1, seed=0).due  # type: ignore[arg-type]
    assert [k for k in range(1, 8) if due(k, last=k == 7)] == [3, 6, 7]
    never = Evaluator(None, "j", every=0, episodes=1, seed=0).due  # type: ignore[arg-type]
    assert not any(never(k, last=True) for k in range(1, 4))
