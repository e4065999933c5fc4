"""Typed, validated hyperparameters for PPO, IMPACT and APPO and the two presets of docs/algorithms.md.

``paper`` is Tables II and III of the Stellaris paper; where the tables are silent it takes RLlib's
defaults, which the paper ran on (PPO: 10 epochs as in the authors' scripts, advantage standardisation;
IMPACT: 1 epoch, gradient-norm clip 40). ``fast`` is what CleanRL and Stable-Baselines3 use for PPO
(MuJoCo: lr 3e-4 annealed linearly over the run, 2048 steps, minibatches of 64, 10 epochs, clip 0.2, λ 0.95, no KL
penalty, 64×64 tanh, observation and reward normalisation; Atari: CleanRL's ``ppo_atari`` settings). ``paper``
keeps Eq. 3's β_k = δ_max·d^k literally; ``fast`` uses the long-run ``horizon_floor`` schedule
(``Schedule``), and its PPO on MuJoCo-like envs the decoupled clip (``functions.algos.ppo.clipped_surrogate``).

Part of the contract: the control plane builds a job's config from a preset and its user's overrides
(``contract.jobspec.resolve_algo``), the typed config crosses to the functions and they train by it;
``functions.algos`` holds what they drive (``staleness``, ``lr_schedule``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from contract.knobs import Rule, StellarisKnobs, rule_field
from contract.replay import ReplaySettings


class Schedule(StrEnum):
    """How β_k of paper Eq. 3 follows the run; every schedule keeps d = 0 synchronous and d = 1 at β = δ_max.

    PAPER: Eq. 3 literally, k = round. Over runs much longer than the paper's 50 rounds β sinks below any
    reachable mean staleness and nearly every round ends in a liveness flush.
    HORIZON: k measured against the run's planned horizon (the job's `Plan`), k_eff = k·paper_rounds/horizon_rounds,
    so the decay over the whole run equals the paper's decay over its 50 rounds (`PAPER_ROUNDS`); PAPER when no
    horizon is known.
    FLOOR: β = max(δ_max·d^k, beta_floor): with L learners applying as their gradients land, the gradient that
    ends a round is about L + 1 versions old, so a floor there keeps rounds ending on the rule rather than in a
    flush. The floor is not capped at δ_max: δ_max comes from round 1's start-up timing (2 to 34 over 18 runs of
    the same 3 seeds), and a cap at a small δ_max would bring the flushes back.
    HORIZON_FLOOR: the horizon-relative k and the floor.
    """

    PAPER = "paper"
    HORIZON = "horizon"
    FLOOR = "floor"
    HORIZON_FLOOR = "horizon_floor"


# The paper's run, in rounds: the decay of β_k = δ_max·d^k that the horizon schedules stretch over the planned run.
PAPER_ROUNDS = 50

# The learning rate over a run (`functions.algos.lr_schedule.learning_rate`).
LrSchedule = Literal["constant", "linear", "exponential"]
FINAL_FRACTION = 0.01  # the exponential schedule's default lr·f at the horizon

EnvKind = Literal["mujoco", "atari"]
PresetName = Literal["paper", "fast"]
AlgoName = Literal["ppo", "impact", "appo"]

UnitInterval = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NetworkConfig(_Frozen):
    """Policy network (``policies.build_policy``): ``auto`` picks the Atari conv net for image observations."""

    kind: Literal["auto", "mlp", "atari"] = "auto"
    hidden: tuple[PositiveInt, ...] = (256, 256)
    activation: Literal["tanh", "relu"] = "tanh"


class StellarisConfig(StellarisKnobs, _Frozen):
    """The Stellaris mechanisms (docs/algorithms.md): aggregation rule (d, v, K, s), truncation (ρ) and β's schedule.

    ``schedule`` picks how β_k = δ_max·d^k (paper Eq. 3) follows the run (``Schedule``), against the run's planned
    rounds (the job's ``Plan``, `contract.jobspec`, not a field here); ``beta_floor`` is the least β the floor
    schedules admit (`stellaris train` sets L + 1).
    """

    rule: Rule = rule_field()  # d, v, rho, truncation, softsync_k, ssp_bound: declared in contract.knobs
    # PPO only ("decoupled" needs PPO's proximal log-probs): see ppo.clipped_surrogate
    truncation_form: Literal["surrogate", "weighted", "decoupled"] = "surrogate"
    schedule: Schedule = Schedule.PAPER
    beta_floor: NonNegativeFloat = 1.0
    # "aggregate": the H scaled gradients of an aggregation averaged into one optimizer step (docs/algorithms.md, paper
    # Eq. 4);
    # "each": one optimizer step per scaled gradient, in queue order, published as one version (a study option).
    optimizer_steps: Literal["aggregate", "each"] = "aggregate"
    # The Stellaris rule's updates take at most this many of the oldest queued gradients (0: the whole queue, as the
    # paper); the rule decides again on the rest.
    max_aggregate: Annotated[int, Field(ge=0, le=4096)] = 0
    # How a stale gradient is scaled: "version", by 1/δ^(1/v) (paper Eq. 4); "distance", element by element by how
    # far the parameters moved since its base version, as Gap-aware SGD does (`functions.algos.gap_aware`): the
    # parameter function keeps the newest `gap_history` published parameter sets for it.
    staleness_penalty: Literal["version", "distance"] = "version"
    gap_history: Annotated[int, Field(ge=2, le=256)] = 16
    # A learner claims its next task (and stores its last gradient) on a thread of its own while it computes, so
    # that the cache I/O is off the computation's path (`functions.learner.claim_ahead`; never under the sync rule).
    claim_ahead: bool = True


class _AlgoConfig(_Frozen):
    """Fields shared by PPO and IMPACT; defaults are the paper's MuJoCo settings."""

    lr: PositiveFloat
    # "linear": annealed towards 0 over the run's planned rounds (CleanRL's anneal_lr; `lr_schedule.learning_rate`);
    # "exponential": decayed towards lr·lr_final_fraction at the horizon
    lr_schedule: LrSchedule = "constant"
    lr_final_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = FINAL_FRACTION
    # Adam's ε (the parameter function's optimizer): torch's default, as RLlib; the fast presets take CleanRL's 1e-5
    adam_eps: PositiveFloat = 1e-8
    gamma: Annotated[float, Field(gt=0.0, le=1.0)] = 0.99
    train_batch_size: PositiveInt = 4096
    num_minibatches: PositiveInt = 4
    num_epochs: PositiveInt
    clip: PositiveFloat
    kl_coef: NonNegativeFloat
    kl_target: PositiveFloat = 0.01
    ent_coef: NonNegativeFloat
    vf_coef: NonNegativeFloat = 1.0
    max_grad_norm: PositiveFloat | None = None
    network: NetworkConfig = NetworkConfig()
    normalize_obs: bool = False
    normalize_reward: bool = False
    stellaris: StellarisConfig = StellarisConfig()

    @model_validator(mode="after")
    def _minibatches_divide_batch(self) -> Self:
        if self.train_batch_size % self.num_minibatches:
            raise ValueError(
                f"train_batch_size {self.train_batch_size} is not divisible by num_minibatches {self.num_minibatches}"
            )
        return self


class PPOConfig(_AlgoConfig):
    """PPO: GAE(γ, λ), clipped surrogate, adaptive KL penalty, entropy, value loss (Table III defaults)."""

    algo: Literal["ppo"] = "ppo"
    lr: PositiveFloat = 5e-5
    lam: UnitInterval = 0.95
    num_epochs: PositiveInt = 10
    clip: PositiveFloat = 0.3
    kl_coef: NonNegativeFloat = 0.2
    ent_coef: NonNegativeFloat = 0.0
    vf_clip: PositiveFloat | None = None
    normalize_advantages: bool = True
    # GAE from the values of the learner's first policy of the round rather than the actors' (a round older when
    # actors run ahead), as plain PPO's come from the policy it trains from (docs/algorithms.md).
    recompute_values: bool = False


class _VTraceConfig(ReplaySettings, _AlgoConfig):
    """Fields of the V-trace algorithms: truncation levels ρ̄, c̄, the target network's refresh period in rounds,
    the gradient-norm clip (RLlib's 40), and the replay pattern (off-policy: `cache.replay.ReplaySettings`)."""

    lr: PositiveFloat = 5e-4
    max_grad_norm: PositiveFloat | None = 40.0
    rho_bar: PositiveFloat = 1.0
    c_bar: PositiveFloat = 1.0
    target_update_frequency: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _no_decoupled_form(self) -> Self:
        if self.stellaris.truncation_form == "decoupled":
            raise ValueError(
                "stellaris.truncation_form 'decoupled' is PPO's (it clips against the round's proximal policy); "
                f"{getattr(self, 'algo', 'this algorithm')} takes 'surrogate' or 'weighted'"
            )
        return self


class IMPACTConfig(_VTraceConfig):
    """IMPACT: V-trace (ρ̄, c̄), target network, clipped surrogate w.r.t. it, KL, entropy (Table III)."""

    algo: Literal["impact"] = "impact"
    num_epochs: PositiveInt = 1
    clip: PositiveFloat = 0.4
    kl_coef: NonNegativeFloat = 1.0
    ent_coef: NonNegativeFloat = 0.01


class APPOConfig(_VTraceConfig):
    """APPO (asynchronous PPO, as in Sample Factory and RLlib): V-trace (ρ̄, c̄) targets and advantages w.r.t. the
    learner policy, PPO's clipped surrogate on π_θ/μ, an optional KL to a target network (``kl_coef`` > 0, refreshed
    every ``target_update_frequency`` rounds as IMPACT's), entropy and value loss (``appo.appo_loss``)."""

    algo: Literal["appo"] = "appo"
    num_epochs: PositiveInt = 2
    clip: PositiveFloat = 0.2
    kl_coef: NonNegativeFloat = 0.0
    ent_coef: NonNegativeFloat = 0.01
    vf_coef: NonNegativeFloat = 0.5
    normalize_advantages: bool = True


AlgoConfig = PPOConfig | IMPACTConfig | APPOConfig
# Each algorithm's config class by its name (the `algo` field): what presets and job specs are built from.
CONFIGS: Mapping[str, type[PPOConfig] | type[IMPACTConfig] | type[APPOConfig]] = MappingProxyType(
    {c.model_fields["algo"].default: c for c in (PPOConfig, IMPACTConfig, APPOConfig)}
)

_FAST_STELLARIS = StellarisConfig(schedule=Schedule.HORIZON_FLOOR)  # the long-run schedule of every fast preset
_FAST_MUJOCO: dict[str, object] = {
    "lr": 3e-4,
    "lr_schedule": "linear",
    "adam_eps": 1e-5,
    "train_batch_size": 2048,
    "num_minibatches": 32,
    "num_epochs": 10,
    "clip": 0.2,
    "kl_coef": 0.0,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "network": NetworkConfig(kind="mlp", hidden=(64, 64), activation="tanh"),
    "normalize_obs": True,
    "normalize_reward": True,
    "stellaris": _FAST_STELLARIS,
}
_FAST_ATARI: dict[str, object] = {
    "lr": 2.5e-4,
    "lr_schedule": "linear",
    "adam_eps": 1e-5,
    "train_batch_size": 1024,
    "num_minibatches": 4,
    "num_epochs": 4,
    "clip": 0.1,
    "kl_coef": 0.0,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "network": NetworkConfig(kind="atari"),
    "stellaris": _FAST_STELLARIS,
}
_PAPER_ATARI: dict[str, object] = {"train_batch_size": 256, "network": NetworkConfig(kind="atari")}


def preset(name: PresetName, algo: AlgoName, env_kind: EnvKind) -> AlgoConfig:
    """The ``paper`` or ``fast`` hyperparameters of ``algo`` for MuJoCo-like or Atari environments."""
    model = CONFIGS.get(algo)
    if model is None:
        raise ValueError(f"unknown algorithm {algo!r}: choose one of {sorted(CONFIGS)}")
    if name == "paper":
        overrides = _PAPER_ATARI if env_kind == "atari" else {}
    elif name == "fast":
        overrides = _FAST_ATARI if env_kind == "atari" else _FAST_MUJOCO
    else:
        raise ValueError(f"unknown preset {name!r}")
    if env_kind not in get_args(EnvKind):
        raise ValueError(f"unknown env kind {env_kind!r}")
    if overrides is _FAST_MUJOCO and algo == "ppo":
        # PPO's clip against the round's first policy, not the behaviour policy actors that run ahead leave up to a
        # round older (`ppo.clipped_surrogate`): on Hopper 500k it lifted the mean return by about half
        # (docs/results/ablations.md)
        overrides = {
            **overrides,
            "stellaris": _FAST_STELLARIS.model_copy(update={"truncation_form": "decoupled"}),
        }
    return model.model_validate(overrides)
