"""Elastic actors (ARTOS §4): how many actors keep the learners fed without over-collecting. Pure: numbers in, an
actor count out; the trainer's glue (stellaris/round/scaling.py) measures the signal and applies the count.

Per round the signal is the learners' consumption rate c (env steps per second of learning), one actor's production
rate r (env steps per second of collection), and the backlog b (env steps landed and not yet consumed when the
round's learning ended) against one round's batch B. Serverful actors collect while learners learn, so n actors keep
up when n·r ≥ c: n* = c / r. The backlog corrects it: a full batch waiting (b = B) is on target, none waiting asks
for more, two waiting for fewer (a proportional term, bounded to ±`backlog_gain`).

The demand is kept per learner, u = n*/L, so that a planned learner change (the learner schedule) scales it at
once, before any round has measured the new capacity (feed-forward), and the measurements then correct it.

Damping (ARTOS: a window of 5 and λ = 0.2): the median of the last `window` demands, so one odd round moves
nothing and a lasting step moves it after ⌈window/2⌉ rounds; and a dead band, the count changes only when the
wanted count differs from the current one by more than max(λ·n, ½): around a steady demand it holds
(hysteresis), instead of stepping back and forth across a rounding boundary.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from gateway.models import ACTOR_PRICING


@dataclass(frozen=True)
class Signal:
    """One round's measurements (see the module's docstring)."""

    consume_steps_s: float  # c: env steps the learners consumed per second of learning
    actor_steps_s: float  # r: env steps one actor collects per second
    backlog_steps: float  # b: env steps landed, not yet consumed, when learning ended
    batch_steps: float  # B: env steps one round consumes
    learners: int  # L: the learners that consumed them


def backlog_gain_for(run_ahead: int, gain: float = 0.5) -> float:
    """The backlog's gain for actors that may run `run_ahead` batches ahead: none at 0, where an actor waits for its
    batch to be trained on before it collects the next, so the backlog is 0 whenever learning ends whatever the
    actor count (a correction from it would always ask for 1 + gain times c / r)."""
    return gain if run_ahead > 0 else 0.0


def actors_per_learner(sig: Signal, *, backlog_gain: float = 0.5) -> float:
    """u = (c / r) · (1 + g·clip((B − b)/B, −1, 1)) / L: the actors one learner needs this round."""
    for name in ("consume_steps_s", "actor_steps_s", "batch_steps"):
        if not getattr(sig, name) > 0:
            raise ValueError(f"{name}: must be > 0, got {getattr(sig, name)}")
    if sig.learners < 1:
        raise ValueError(f"learners: must be >= 1, got {sig.learners}")
    shortfall = max(-1.0, min(1.0, (sig.batch_steps - sig.backlog_steps) / sig.batch_steps))
    return sig.consume_steps_s / sig.actor_steps_s * (1.0 + backlog_gain * shortfall) / sig.learners


class ActorController:
    """The damped controller: `observe` a round's signal, then `decide` the next round's count."""

    def __init__(
        self, *, min_actors: int, max_actors: int, window: int = 5, lam: float = 0.2, backlog_gain: float = 0.5
    ) -> None:
        if not 1 <= min_actors <= max_actors:
            raise ValueError(f"min_actors, max_actors: need 1 <= {min_actors} <= {max_actors}")
        if window < 1:
            raise ValueError(f"window: must be >= 1, got {window}")
        if not 0.0 <= lam < 1.0:
            raise ValueError(f"lam: must be in [0, 1), got {lam}")
        self.min_actors, self.max_actors, self.lam, self.backlog_gain = min_actors, max_actors, lam, backlog_gain
        self.demands: deque[float] = deque(maxlen=window)

    def observe(self, sig: Signal) -> float:
        """Adds the round's per-learner demand to the window; returns it."""
        u = actors_per_learner(sig, backlog_gain=self.backlog_gain)
        self.demands.append(u)
        return u

    def wanted(self, learners: int) -> float | None:
        """The smoothed demand for `learners` learners (median of the window × L); None until the window is full
        (the first rounds include start-up and say little about steady state)."""
        if len(self.demands) < (self.demands.maxlen or 1):
            return None
        return statistics.median(self.demands) * learners

    def decide(self, actors: int, learners: int) -> int:
        """The actor count for `learners` learners, given `actors` now: unchanged inside the dead band, else the
        wanted count rounded, within [min_actors, max_actors]."""
        wanted = self.wanted(learners)
        if wanted is None or abs(wanted - actors) <= max(self.lam * actors, 0.5):
            return min(self.max_actors, max(self.min_actors, actors))
        return min(self.max_actors, max(self.min_actors, math.floor(wanted + 0.5)))


def actor_cost_per_round(actors: int, held_s: float) -> float:
    """What `actors` actors cost over one round in which each is held (serverful) or invoked (serverless) for
    `held_s` seconds, at the actors' price per resource-second (docs/experiments.md: one core of a c6a.32xlarge)."""
    return actors * held_s * ACTOR_PRICING.usd_per_second
