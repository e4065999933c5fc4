"""The control plane's side of the distribution profiles (`distribution`, contract/distribution.py).

``trajectories`` is today's round protocol (`Rounds`). ``gradients_at_actors`` invokes no learner: the actors ship
their batches' gradients themselves (functions/actor/fused.py), so a round is one parameter invocation, started when the
round starts so that it applies gradients while the actors compute them (each actor task takes the newest version,
A3C style), and ended once the round's headers are in: the round is closed, and the invocation leaves when no
gradient is queued. A parameter call whose instance died is replaced, as in the other profile.
"""

from __future__ import annotations

from typing import Any

from cache import JobCache, LearnerTask
from stellaris.config import TrainConfig
from stellaris.round.protocol import Functions, Rounds, RoundStats, _RoundCalls


class FusedRounds(Rounds):
    """Rounds of the gradients_at_actors profile: no learner invocations, one parameter invocation a round."""

    def __init__(self, job: JobCache, functions: Functions, **kwargs: Any) -> None:
        super().__init__(job, functions, **(kwargs | {"invocations": 0}))
        self.calls: _RoundCalls | None = None

    def begin(self, round_k: int, stats: RoundStats) -> None:
        """Start the round's parameter invocation before its batches are collected."""
        self.calls = _RoundCalls(self, round_k, stats)
        self.calls.start()

    def learn(self, round_k: int, tasks: list[LearnerTask], stats: RoundStats) -> None:
        """The round's headers are in (`tasks` name its batches; actors computed their gradients): close the round
        and wait for the parameter invocation to apply what is queued."""
        if self.calls is None or self.calls.round_k != round_k:
            self.begin(round_k, stats)
        assert self.calls is not None
        self.job.board.close(round_k)
        self.calls.supervise(until_drained=False)
        self.calls = None


def rounds_for(cfg: TrainConfig) -> type[Rounds]:
    """The round protocol of the config's distribution profile."""
    return FusedRounds if cfg.distribution == "gradients_at_actors" else Rounds
