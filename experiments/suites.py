"""The paper's evaluation (seeds/001 §VIII) as run plans: which training runs each suite needs, under which preset.

A run is named by what it trains (env, algorithm, variant, seed) plus a digest of its whole configuration, so two
suites that need the same run (the algorithms and cost suites, the ablation's Stellaris row) share one directory
under the same output root and it runs once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stellaris.config import default_learners

SuiteName = Literal["algorithms", "cost", "ablation", "sensitivity", "breakdown", "rllib"]
PresetName = Literal["quick", "paper", "long"]
SUITES: tuple[str, ...] = ("algorithms", "cost", "ablation", "sensitivity", "breakdown")
# Suites that also run another system: `rllib` (experiments/rllib_suite.py) adds RLlib's PPO to the Stellaris runs
# planned here.
BASELINE_SUITES: tuple[str, ...] = ("rllib",)
ALL_SUITES: tuple[str, ...] = SUITES + BASELINE_SUITES

MUJOCO = ("Hopper-v5", "Walker2d-v5", "Humanoid-v5")
ATARI = ("ALE/SpaceInvaders-v5", "ALE/Qbert-v5", "ALE/Gravitar-v5")
ENVS = MUJOCO + ATARI
ALGOS = ("ppo", "impact")

# Vanilla: the algorithm as a serverful distributed job (synchronous learners, resources held for the whole run);
# Stellaris: serverless asynchronous learners with staleness-aware aggregation and truncation, metered per call.
VARIANTS: dict[str, dict[str, Any]] = {
    "vanilla": {"mode": "sync", "billing": "serverful"},
    "stellaris": {"mode": "stellaris", "billing": "serverless"},
}
ABLATION: dict[str, dict[str, Any]] = {
    "stellaris": VARIANTS["stellaris"],
    "sync": {"mode": "sync", "billing": "serverless"},
    "async": {"mode": "async", "billing": "serverless"},
    "softsync": {"mode": "softsync", "billing": "serverless"},
    "ssp": {"mode": "ssp", "billing": "serverless"},
    "no-truncation": {**VARIANTS["stellaris"], "truncation": False},
}
SENSITIVITY: dict[str, tuple[float, ...]] = {
    "d": (0.92, 0.94, 0.96, 0.98, 1.0),
    "v": (1.0, 2.0, 3.0, 4.0),
    "rho": (0.6, 0.8, 1.0, 1.2),
}
SENSITIVITY_DEFAULTS = {"d": 0.96, "v": 3.0, "rho": 1.0}


@dataclass(frozen=True)
class Budget:
    """What a preset gives each run; baselines and Stellaris get the same (docs/algorithms.md)."""

    description: str
    default_seeds: int
    learners: int | None  # None: what `stellaris train` picks on this machine (`default_learners`: 1 on 2 cores)
    actors: int
    rounds: dict[str, int]  # by env kind
    suite_rounds: dict[str, dict[str, int]] = field(default_factory=dict)  # suite -> env kind -> rounds, if not rounds
    preset: str = "paper"  # the algorithm preset (docs/algorithms.md)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # env kind -> algorithm fields


PRESETS: dict[str, Budget] = {
    "paper": Budget(
        description="the paper's settings: 50 rounds, Table III hyperparameters (4096 / 256 env steps per round, "
        "4 minibatches, PPO 10 epochs, IMPACT 1), 4 learner functions, 10 seeds",
        default_seeds=10,
        learners=4,
        actors=2,
        rounds={"mujoco": 50, "atari": 50},
    ),
    "quick": Budget(
        description="QUICK preset, a far smaller budget than the paper's: rounds of 2048 env steps (MuJoCo) or 512 "
        "(Atari), 8 rounds per run (Atari 6; ablation 30, sensitivity 12, breakdown 4, rllib 12), 4 minibatches x 4 "
        "epochs, the fast (CleanRL) hyperparameters, 2 learner functions, 2 seeds. Early-training numbers, not the "
        "paper's",
        preset="fast",
        default_seeds=2,
        learners=2,
        actors=2,
        rounds={"mujoco": 8, "atari": 6},
        suite_rounds={
            "ablation": {"mujoco": 30},
            "sensitivity": {"mujoco": 12},
            "breakdown": {"mujoco": 4, "atari": 4},
            "rllib": {"mujoco": 12},  # 24,576 env steps: a few minutes for both systems on 2 cores
        },
        overrides={
            "mujoco": {"num_minibatches": 4, "num_epochs": 4},
            "atari": {"train_batch_size": 512, "num_minibatches": 4, "num_epochs": 2},
        },
    ),
    "long": Budget(
        description="LONG preset: 500k env steps on MuJoCo (245 rounds of 2048), the fast (CleanRL) hyperparameters "
        "unchanged (32 minibatches x 10 epochs), `stellaris train`'s defaults for this machine (on 2 cores 1 actor x "
        "2 envs, 1 learner function), 3 seeds; rewards are also read at half the run (the 50k steps before 250k) and "
        "its end",
        preset="fast",
        default_seeds=3,
        learners=None,
        actors=1,
        rounds={"mujoco": 245, "atari": 245},
    ),
}


def env_kind(env: str) -> str:
    return "atari" if env.startswith("ALE/") else "mujoco"


def env_label(env: str) -> str:
    """Hopper-v5 -> Hopper, ALE/SpaceInvaders-v5 -> SpaceInvaders."""
    return env.removeprefix("ALE/").rsplit("-v", 1)[0]


@dataclass(frozen=True)
class RunPlan:
    """One training run of a suite: `group` is what it is compared within (e.g. ppo/Hopper), `variant` its row."""

    group: str
    variant: str
    seed: int
    config: dict[str, Any]  # TrainConfig fields, without the run directory or deployment URLs

    @property
    def run_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode()).hexdigest()[:8]
        algo, env, mode = self.config["algo"], env_label(self.config["env"]).lower(), self.config["mode"]
        return f"{env}-{algo}-{mode}-s{self.seed}-{digest}"  # from the configuration alone, so equal runs coincide

    @property
    def rounds(self) -> int:
        return int(self.config["rounds"])


def _config(suite: str, budget: Budget, env: str, algo: str, seed: int, fields: dict[str, Any]) -> dict[str, Any]:
    kind = env_kind(env)
    rounds = budget.suite_rounds.get(suite, {}).get(kind, budget.rounds[kind])
    return {
        "env": env,
        "algo": algo,
        "preset": budget.preset,
        "rounds": rounds,
        "learners": default_learners() if budget.learners is None else budget.learners,
        "actors": budget.actors,
        "seed": seed,
        "overrides": dict(budget.overrides.get(kind, {})),
        **fields,
    }


def _seed_runs(suite: str, budget: Budget, seed: int) -> list[RunPlan]:
    """The runs of `suite` (a known one) for one seed."""

    def run(group: str, variant: str, env: str, algo: str, fields: dict[str, Any]) -> RunPlan:
        return RunPlan(group, variant, seed, _config(suite, budget, env, algo, seed, fields))

    stellaris = VARIANTS["stellaris"]
    if suite in ("algorithms", "cost"):
        return [
            run(f"{algo}/{env_label(env)}", variant, env, algo, fields)
            for algo in ALGOS
            for env in ENVS
            for variant, fields in VARIANTS.items()
        ]
    if suite == "breakdown":
        return [run(f"ppo/{env_label(env)}", "stellaris", env, "ppo", stellaris) for env in ENVS]
    if suite == "rllib":  # the Stellaris side; rllib_suite adds RLlib's run of the same budget
        return [run("ppo/Hopper", "stellaris", "Hopper-v5", "ppo", stellaris)]
    if suite == "ablation":
        return [run("ppo/Hopper", variant, "Hopper-v5", "ppo", fields) for variant, fields in ABLATION.items()]
    return [  # sensitivity: one parameter at a time away from the paper's defaults
        run(name, f"{name}={value:g}", "Hopper-v5", "ppo", {**stellaris, **SENSITIVITY_DEFAULTS, name: value})
        for name, values in SENSITIVITY.items()
        for value in values
    ]


def plan(
    suite: str, preset: str, seeds: int, variants: Sequence[str] | None = None, *, first_seed: int = 0
) -> list[RunPlan]:
    """The runs of `suite` under `preset` for seeds first_seed..first_seed+seeds-1, only the rows in `variants` when
    given; raises ValueError naming a bad argument."""
    if suite not in ALL_SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(ALL_SUITES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    if first_seed < 0:
        raise ValueError(f"first_seed must be at least 0 (env seeds are non-negative), got {first_seed}")
    budget = PRESETS[preset]
    runs = [run for seed in range(first_seed, first_seed + seeds) for run in _seed_runs(suite, budget, seed)]
    if variants is not None:
        known = list(dict.fromkeys(p.variant for p in runs))
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise ValueError(f"unknown variant(s) {', '.join(unknown)} of {suite}; choose from {', '.join(known)}")
        runs = [p for p in runs if p.variant in variants]
    return runs


BASELINES: dict[str, str | None] = {
    # The row every other row of its group is compared with (ratios = row / baseline).
    "algorithms": "vanilla",
    "cost": "vanilla",
    "ablation": "stellaris",
    "sensitivity": None,  # per group: the paper's default value of that parameter
    "breakdown": None,
    "rllib": "rllib",  # the paper's Fig. 9: Stellaris against RLlib
}


def baseline_of(suite: str, group: str) -> str | None:
    if suite == "sensitivity":
        return f"{group}={SENSITIVITY_DEFAULTS[group]:g}"
    return BASELINES[suite]
