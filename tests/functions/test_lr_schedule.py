"""The learning rate over a run (`functions.algos.lr_schedule`): hand-computed rates, and the parameter function
stepping with round k's rate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cache import Cache
from contract.algo_config import PPOConfig, preset
from contract.jobspec import Plan
from functions.algos.lr_schedule import learning_rate
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec


@pytest.mark.parametrize(
    ("round_k", "horizon", "expected"),
    [
        (1, 4, 3e-4),  # the first round steps with the full rate
        (2, 4, 2.25e-4),  # 3e-4 * (1 - 1/4)
        (4, 4, 7.5e-5),  # the last planned round: 3e-4 / 4
        (9, 4, 7.5e-5),  # past the horizon (a resumed run given more rounds) it stays at lr / N
        (123, 245, 3e-4 * 123 / 245),  # a 500k-step Hopper run halfway
    ],
)
def test_linear_anneals_towards_zero_over_the_planned_rounds(round_k: int, horizon: int, expected: float) -> None:
    assert learning_rate(3e-4, "linear", round_k=round_k, horizon_rounds=horizon) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("round_k", "horizon", "fraction", "expected"),
    [
        (1, 4, 0.01, 3e-4),  # the first round steps with the full rate
        (3, 4, 0.01, 3e-5),  # 3e-4 * 0.01^(2/4)
        (4, 4, 0.01, 3e-4 * 0.01**0.75),  # the last planned round: 9.4868e-6
        (9, 4, 0.01, 3e-4 * 0.01**0.75),  # past the horizon it stays at the last round's rate
        (2, 2, 0.25, 1.5e-4),  # 3e-4 * 0.25^(1/2)
        (5, 4, 1.0, 3e-4),  # a final fraction of 1 is a constant rate
    ],
)
def test_exponential_decays_towards_the_final_fraction_at_the_horizon(
    round_k: int, horizon: int, fraction: float, expected: float
) -> None:
    got = learning_rate(3e-4, "exponential", round_k=round_k, horizon_rounds=horizon, final_fraction=fraction)
    assert got == pytest.approx(expected, rel=1e-12)


def test_constant_and_an_unknown_horizon_keep_the_base_rate() -> None:
    assert learning_rate(3e-4, "constant", round_k=50, horizon_rounds=100) == 3e-4
    assert learning_rate(3e-4, "linear", round_k=50, horizon_rounds=None) == 3e-4  # a run bounded by minutes only
    assert learning_rate(3e-4, "exponential", round_k=50, horizon_rounds=None) == 3e-4


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="round_k counts from 1"):
        learning_rate(3e-4, "linear", round_k=0, horizon_rounds=4)
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'cosine'"):
        learning_rate(3e-4, "cosine", round_k=1, horizon_rounds=4)  # type: ignore[arg-type]
    # the horizon's and the final fraction's bounds are their declarations', checked where the plan and config enter
    with pytest.raises(ValidationError, match="horizon_rounds\n  Input should be greater than 0"):
        Plan(horizon_rounds=0)
    for fraction in (0.0, -0.5, 1.5):
        with pytest.raises(ValidationError, match="lr_final_fraction"):
            PPOConfig(lr_final_fraction=fraction)


def test_the_fast_preset_anneals_as_cleanrl_does_and_the_paper_preset_does_not() -> None:
    assert preset("fast", "ppo", "mujoco").lr_schedule == "linear"
    assert preset("fast", "ppo", "atari").lr_schedule == "linear"
    assert preset("paper", "ppo", "mujoco").lr_schedule == "constant"


@pytest.mark.parametrize(
    ("schedule", "round_2_lr"),
    [("linear", 5e-4), ("constant", 1e-3), ("exponential", 1e-4)],  # 1e-3 * 0.01^(1/2)
)
def test_the_parameter_function_steps_with_the_rate_of_the_round_it_aggregates(
    cache_conn: Cache, job_id: str, schedule: str, round_2_lr: float
) -> None:
    spec = small_spec(job_id)
    algo = spec.algo.model_copy(update={"lr_schedule": schedule, "adam_eps": 1e-5})  # 1e-3 over a 2-round horizon
    driver = Driver(cache_conn, spec.model_copy(update={"algo": algo, "plan": Plan(horizon_rounds=2)}), actors=1)
    rates = []
    try:
        for _ in range(2):
            driver.run_round(mode="stellaris")
            (model,) = driver.instance.memo.models.values()  # the parameter function's warm policy and optimizer
            rates.append([g["lr"] for g in model.optimizer.param_groups])
            assert [g["eps"] for g in model.optimizer.param_groups] == [1e-5]  # the job's Adam ε, not torch's
    finally:
        driver.job.delete()
    assert rates == [[pytest.approx(1e-3)], [pytest.approx(round_2_lr)]]
