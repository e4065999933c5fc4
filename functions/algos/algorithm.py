"""The seam between the handlers and an algorithm: what a learner task and a round boundary need of it.

Each algorithm is one module (``ppo_algo``, ``impact_algo``, ``appo_algo``) that builds one `Algorithm` from its
own functions, and one row of the name table (``registry``). The handlers call these and nothing algorithm-specific:

- ``prepare(batches, cfg)``: a round's data, once per learner instance and round (all tasks of a round share it);
- ``with_policy(data, policy, cfg)``: that data completed with what the instance's first policy of the round says
  of it (PPO's proximal log-probs for the decoupled clip), on the instance's device;
- ``gradient(policy, data, task, cfg, inputs)``: one task's named gradient tensors and statistics;
- ``start_round(state, cfg, new_round=, version=)``: the aggregator state at a round boundary (the parameter
  function), e.g. PPO's adaptive KL coefficient, IMPACT's and APPO's target network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from contract import AggregatorState
from contract.algo_config import AlgoConfig
from functions.algos.impact import should_update_target
from functions.model.policies import ActorCritic

Gradient = tuple[dict[str, Tensor], dict[str, float]]


@dataclass(frozen=True)
class LearnInputs:
    """What a task's gradient takes besides its policy and data: the policies other learners hold (truncation,
    paper Eq. 2), the target network (algorithms that use one), and the aggregator's KL coefficient (None: the
    config's)."""

    others: Sequence[ActorCritic] = ()
    target: ActorCritic | None = None
    kl_coef: float | None = None
    seed: int = 0  # the job's: with the round and epoch it fixes the minibatch order


def no_target(cfg: Any) -> bool:
    return False


def data_as_is(data: Any, policy: ActorCritic, cfg: Any) -> Any:
    return data


@dataclass(frozen=True)
class Algorithm:
    """One algorithm behind the seam; ``uses_target(cfg)``: its tasks need the target network's policy."""

    name: str
    config: type[AlgoConfig]
    prepare: Callable[[Sequence[Any], Any], Any]
    gradient: Callable[[ActorCritic, Any, Any, Any, LearnInputs], Gradient]
    start_round: Callable[..., AggregatorState]
    uses_target: Callable[[Any], bool] = no_target
    with_policy: Callable[[Any, ActorCritic, Any], Any] = data_as_is


def reset_round_kl(state: AggregatorState, new_round: int) -> AggregatorState:
    """The new round starts with no observed KL."""
    return state.with_(round_k=new_round, kl_sum=0.0, kl_n=0)


def refresh_target(state: AggregatorState, *, new_round: int, version: int, every: float) -> AggregatorState:
    """Copy π_θ (the current version) into the target network when its update frequency in rounds (`every`,
    ``target_update_frequency``) says so."""
    if should_update_target(new_round - state.target_round, target_update_frequency=every):
        return state.with_(target_version=version, target_round=new_round)
    return state
