"""Periodic deterministic evaluation, as Stable-Baselines3's EvalCallback: every `eval_every` rounds, and after the
run's last round, `eval_episodes` whole episodes of the policy the round ended with, deterministic actions (the
mode of the policy), on an env of its own (seeded seed + EVAL_SEED_OFFSET, never one of the actors' envs).

The control plane runs no functions code (docs/architecture.md): an evaluation is one invocation of the job's actor
function with
an `evaluate` event, through the gateway, metered like any other. A call whose instance died is made again; any
other failure costs the round its evaluation (NaN columns and a warning), never the run.
"""

from __future__ import annotations

import logging
from typing import Any

from contract.results import EVAL_MAX_EPISODE_STEPS, EvalRequest, EvalResult
from gateway.models import Activation
from stellaris.round.protocol import Functions
from stellaris.rundir.outputs import stats

EVAL_SEED_OFFSET = 1_000_003  # far from the actors' seeds (seed + 7919 * actor index)
EVAL_ATTEMPTS = 3  # calls of one evaluation whose instance died, before the round goes without it

log = logging.getLogger("stellaris.train")


def eval_columns(returns: list[float]) -> dict[str, Any]:
    """info.csv's evaluation columns for one evaluation's episode returns (NaN and 0 for none)."""
    r_max, r_mean, r_min, r_std = stats(returns)
    return {
        "eval_reward_max": r_max,
        "eval_reward_mean": r_mean,
        "eval_reward_min": r_min,
        "eval_reward_std": r_std,
        "eval_episodes": len(returns),
    }


class Evaluator:
    """A job's evaluations. `every` 0: never."""

    def __init__(
        self,
        functions: Functions,
        job_id: str,
        *,
        every: int,
        episodes: int,
        seed: int,
        max_episode_steps: int = EVAL_MAX_EPISODE_STEPS,
    ) -> None:
        self.functions, self.job_id = functions, job_id
        self.every, self.episodes, self.seed = every, episodes, seed + EVAL_SEED_OFFSET
        self.max_episode_steps = max_episode_steps

    def due(self, round_k: int, *, last: bool) -> bool:
        """Every `every` rounds, and the run's last round (its final policy gets a score of its own)."""
        return self.every > 0 and (round_k % self.every == 0 or last)

    def evaluate(self, round_k: int, version: int | None) -> tuple[dict[str, Any], list[Activation]]:
        """The info row's evaluation columns for policy `version` and the metered activations of the calls."""
        request = EvalRequest(
            episodes=self.episodes, seed=self.seed, version=version, max_episode_steps=self.max_episode_steps
        )
        event = {"job": self.job_id, "evaluate": request.to_dict()}
        acts: list[Activation] = []
        failure: BaseException | None = None
        for _ in range(EVAL_ATTEMPTS):
            try:
                call = self.functions.invoke("actor", event)
                if call.metered is not None:
                    acts.append(call.metered)
                return eval_columns(EvalResult.from_dict(call.result).episode_returns), acts
            except Exception as exc:  # the run goes on without this evaluation: warned below
                failure = exc
                if not self.functions.died(exc):
                    break
        log.warning("round %d: evaluation failed, its eval_reward_* columns are NaN: %s", round_k, failure)
        return eval_columns([]), acts
