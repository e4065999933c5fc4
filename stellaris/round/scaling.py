"""The trainer's elastic glue (docs/workflows.md): at a round's start the learner schedule sets the round's
learner capacity; at its end the round's signal goes to the damped controller (stellaris/round/elastic.py), its
count is applied (serverful actors started or stopped, serverless ones invoked that many, pre-warmed ahead), and
the round's info.csv columns (ELASTIC_COLUMNS) say what changed and what it costs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cache import BatchMeta
from stellaris.round.elastic import ActorController, Signal, actor_cost_per_round, backlog_gain_for

if TYPE_CHECKING:
    from stellaris.config import TrainConfig
    from stellaris.round.trainer import Trainer

ELASTIC_COLUMNS = [
    "learners", "actors", "actor_change", "actors_prewarmed", "actors_per_learner", "actor_demand", "backlog_steps",
    "batch_wait_s", "actor_cost_round_before", "actor_cost_round_after", "batches_lost", "policy_lag",
]  # fmt: skip


def policy_lag(batches: Sequence[tuple[str, BatchMeta]], version: int | None) -> int | float:
    """Versions from the oldest policy that collected any of a round's batches to `version`, the one its learning
    starts from (NaN without either). The trajectory queue's bound (`actor_run_ahead`) caps it in rounds."""
    if version is None or not batches:
        return math.nan
    return version - min(meta.behaviour_version for _, meta in batches)


def actor_steps_s(batches: Sequence[tuple[str, BatchMeta]]) -> float | None:
    """One actor's collection rate: the round's env steps over the batches' summed collection spans (None when no
    batch carries a span)."""
    steps = seconds = 0.0
    for _, meta in batches:
        span = meta.info.get("collect_span")
        if span is not None and float(span[1]) > float(span[0]):
            steps += meta.env_steps
            seconds += float(span[1]) - float(span[0])
    return steps / seconds if seconds > 0 else None


class BatchSequence:
    """Each serverful actor numbers its batches 0, 1, 2, ... (`batch_seq`); a gap in what the control plane consumes
    is a batch that landed and was lost. A restarted actor counts from 0 again."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}

    def lost(self, batches: Sequence[tuple[str, BatchMeta]]) -> int:
        gaps = 0
        for _, meta in batches:
            seq = meta.info.get("batch_seq")
            if seq is None:
                continue
            gaps += max(0, int(seq) - self.next.get(meta.actor_id, 0))
            self.next[meta.actor_id] = int(seq) + 1
        return gaps


def resumed_actors(cfg: TrainConfig, saved: Mapping[str, Any]) -> TrainConfig:
    """On resume, the actor count elastic actors had reached (a checkpoint's `Scaler.state()`), within the bounds,
    rather than the count the run was configured to start with."""
    if not cfg.elastic_actors or saved.get("actors") is None:
        return cfg
    return cfg.model_copy(update={"actors": min(cfg.max_actors, max(cfg.min_actors, int(saved["actors"])))})


class Scaler:
    """Per round: `begin_round` before anything else of the round, `end_round` when its info row is built. `saved`
    (a checkpoint's `state()`) refills the controller's window, so a resumed run decides from its first round on."""

    def __init__(self, trainer: Trainer, saved: Mapping[str, Any] | None = None) -> None:
        self.t = trainer
        cfg = trainer.cfg
        self.controller = (
            ActorController(
                min_actors=cfg.min_actors,
                max_actors=cfg.max_actors,
                window=cfg.elastic_window,
                lam=cfg.elastic_lambda,
                backlog_gain=backlog_gain_for(cfg.actor_run_ahead),
            )
            if cfg.elastic_actors
            else None
        )
        if self.controller is not None:
            self.controller.demands.extend(float(u) for u in (saved or {}).get("demands") or [])
        self.sequence = BatchSequence()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the actor count and the controller's window of demands."""
        demands = [] if self.controller is None else list(self.controller.demands)
        return {"actors": self.t.cfg.actors, "demands": demands}

    def begin_round(self) -> None:
        """The learner schedule's capacity for this round: the round protocol's learners and the pre-warm count
        (the trainer's cfg), and under serverful billing the slots charged from now."""
        t = self.t
        learners = t.cfg.learners_at(t.round)
        if learners == t.rounds.learners:
            return
        t.billing.charge_held(serverful_actors=bool(t.deployment.actors.procs))
        t.billing.learners = learners
        t.rounds.set_learners(learners)
        t.cfg = t.cfg.model_copy(update={"learners": learners})

    def end_round(
        self, batches: Sequence[tuple[str, BatchMeta]], duration_s: float, collect_s: float
    ) -> dict[str, Any]:
        """The round's signal to the controller, its count applied for the next round; the round's columns. The
        billing is charged up to now already (the trainer's _record), so a change is charged from now."""
        t = self.t
        serverful = t.cfg.actor_kind == "serverful"
        actors, learners = t.cfg.actors, t.rounds.learners
        steps = float(sum(meta.env_steps for _, meta in batches))
        backlog_steps = t.job.trajectories.stream.length() * steps / max(1, len(batches))  # batches of one size
        held_s = duration_s if serverful else collect_s  # serverful actors are held all round, invocations collect
        columns: dict[str, Any] = {
            "learners": learners,
            "batch_wait_s": round(collect_s, 4),  # the learners idle since the last round's learning ended
            "backlog_steps": round(backlog_steps, 1),
            "batches_lost": self.sequence.lost(batches) if serverful else 0,
            "policy_lag": policy_lag(batches, t.gate.fired_version),
            "actors_per_learner": math.nan,
            "actor_demand": math.nan,
        }
        target, prewarmed = actors, 0
        rate = actor_steps_s(batches)
        learn_s = duration_s - collect_s
        if self.controller is not None and rate is not None and steps > 0 and learn_s > 0:
            sig = Signal(steps / learn_s, rate, backlog_steps, steps, learners)
            columns["actors_per_learner"] = self.controller.observe(sig)  # unrounded: the run can be replayed
            # Planned scale-ups are taken a round early (pre-warming): the learners of the round after next count.
            soon, after = t.cfg.learners_at(t.round + 1), t.cfg.learners_at(t.round + 2)
            wanted = self.controller.wanted(max(soon, after))
            columns["actor_demand"] = math.nan if wanted is None else round(wanted, 3)
            base, target = self.controller.decide(actors, soon), self.controller.decide(actors, max(soon, after))
            prewarmed = max(0, target - max(base, actors))
            if target != actors:
                self._apply(target, serverful)
                prewarmed = prewarmed if serverful else max(0, target - actors)  # serverless: every added instance
        return columns | {
            "actors": target,
            "actor_change": f"{target - actors:+d}" if target != actors else "0",
            "actors_prewarmed": prewarmed,
            "actor_cost_round_before": actor_cost_per_round(actors, held_s),
            "actor_cost_round_after": actor_cost_per_round(target, held_s),
        }

    def _apply(self, target: int, serverful: bool) -> None:
        t = self.t
        t.billing.actors = target
        if serverful:
            t.deployment.actors.scale(target)
        elif target > t.cfg.actors:  # instances warm before the next round invokes them
            t.deployment.gateway.prewarm(t.names["actor"], target)
        t.cfg = t.cfg.model_copy(update={"actors": target})
