"""Run plans of the paper's suites: sizes, shared runs, equal budgets for baselines and Stellaris."""

from __future__ import annotations

import pytest

from experiments.suites import ENVS, SUITES, baseline_of, plan
from stellaris.config import default_learners


@pytest.mark.parametrize(
    ("suite", "runs"),
    [("algorithms", 2 * 6 * 2), ("cost", 2 * 6 * 2), ("ablation", 6), ("sensitivity", 5 + 4 + 4), ("breakdown", 6)],
)
def test_plan_sizes_per_seed(suite: str, runs: int) -> None:
    assert len(plan(suite, "quick", 1)) == runs
    assert len(plan(suite, "paper", 3)) == 3 * runs


def test_sensitivity_default_point_is_one_run_shared_by_its_three_rows() -> None:
    plans = plan("sensitivity", "quick", 2)
    defaults = [p for p in plans if p.variant in ("d=0.96", "v=3", "rho=1")]
    assert len(defaults) == 6 and len({p.run_id for p in defaults}) == 2  # one per seed
    assert len({p.run_id for p in plans}) == 2 * (5 + 4 + 4 - 2)


def test_algorithms_and_cost_share_runs() -> None:
    assert {p.run_id for p in plan("algorithms", "quick", 2)} == {p.run_id for p in plan("cost", "quick", 2)}


@pytest.mark.parametrize("preset", ["quick", "paper"])
def test_baseline_and_stellaris_get_the_same_budget(preset: str) -> None:
    budget_keys = ("env", "algo", "preset", "rounds", "learners", "actors", "seed", "overrides")
    by_group: dict[tuple[str, int], list[dict]] = {}
    for p in plan("algorithms", preset, 2):
        by_group.setdefault((p.group, p.seed), []).append({k: p.config[k] for k in budget_keys})
    assert len(by_group) == 2 * len(ENVS) * 2
    for configs in by_group.values():
        assert len(configs) == 2 and configs[0] == configs[1]


def test_paper_preset_is_the_papers_setting() -> None:
    plans = plan("algorithms", "paper", 1)
    assert {p.config["rounds"] for p in plans} == {50}
    assert {p.config["preset"] for p in plans} == {"paper"} and all(not p.config["overrides"] for p in plans)
    assert {p.config["learners"] for p in plans} == {4}


def test_long_preset_is_500k_steps_of_the_fast_settings_on_the_2_core_defaults() -> None:
    plans = plan("ablation", "long", 3, ["stellaris", "sync", "async", "softsync", "ssp"])
    assert [p.variant for p in plans[:5]] == ["stellaris", "sync", "async", "softsync", "ssp"]
    assert len(plans) == 15 and {p.seed for p in plans} == {0, 1, 2}
    assert {p.config["rounds"] for p in plans} == {245}  # 245 x 2048 = 501,760 env steps
    # the learners `stellaris train` would pick here, so the suite's stellaris row is the command
    assert {(p.config["preset"], p.config["learners"], p.config["actors"]) for p in plans} == {
        ("fast", default_learners(), 1)
    }
    assert all(not p.config["overrides"] for p in plans)  # CleanRL's 32 minibatches x 10 epochs


def test_first_seed_shifts_the_seeds_and_a_shared_seed_is_the_same_run() -> None:
    from_one = plan("ablation", "long", 3, ["stellaris"], first_seed=1)
    assert [p.seed for p in from_one] == [1, 2, 3]
    assert all(p.config["seed"] == p.seed and f"-s{p.seed}-" in p.run_id for p in from_one)
    # seeds 1 and 2 are the runs a default plan (seeds 0-2) has: one results root shares them
    from_zero = {p.seed: p.run_id for p in plan("ablation", "long", 3, ["stellaris"])}
    assert [p.run_id for p in from_one[:2]] == [from_zero[1], from_zero[2]]
    with pytest.raises(ValueError, match=r"first_seed must be at least 0 .*, got -1"):
        plan("ablation", "long", 3, first_seed=-1)


def test_variants_filter_and_a_bad_variant_is_named() -> None:
    assert [p.variant for p in plan("ablation", "quick", 1, ["async"])] == ["async"]
    with pytest.raises(ValueError, match=r"unknown variant\(s\) nope of ablation; choose from stellaris, sync"):
        plan("ablation", "quick", 1, ["nope"])


def test_baselines() -> None:
    assert baseline_of("algorithms", "ppo/Hopper") == "vanilla"
    assert baseline_of("ablation", "ppo/Hopper") == "stellaris"
    assert baseline_of("sensitivity", "rho") == "rho=1"
    assert baseline_of("breakdown", "ppo/Hopper") is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope", "quick", 1), "unknown suite 'nope'"),
        (("ablation", "huge", 1), "unknown preset 'huge'"),
        (("ablation", "quick", 0), "seeds must be at least 1"),
    ],
)
def test_bad_arguments_are_named(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(*args)
    assert set(SUITES) == {"algorithms", "cost", "ablation", "sensitivity", "breakdown"}
