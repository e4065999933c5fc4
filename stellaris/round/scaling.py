"""The trainer's elastic glue (docs/workflows.md): at a round's start the learner schedule sets the round's
learner capacity; at its end the round's signal goes to the damped controller (stellaris/round/elastic.py), its
count is applied (serverful actors started or stopped, serverless ones invoked that many, pre-warmed ahead), and
the round's info.csv columns (ELASTIC_COLUMNS, stellaris/rundir/outputs.py) say what changed and what it costs. The
scaler acts on the round protocol, the billing and the actors it is given, and returns the config with the counts it
changed; it reads nothing else of the job."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cache import BatchMeta
from stellaris.platform.billing import Billing
from stellaris.platform.serverful_actors import ServerfulActors
from stellaris.round.elastic import ActorController, Signal, actor_cost_per_round, backlog_gain_for
from stellaris.round.protocol import Rounds

if TYPE_CHECKING:
    from stellaris.config import TrainConfig


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
    """Per round: `begin_round` before anything else of the round, `end_round` when its info row is built; each
    takes the job's config as the last round left it and returns it with the counts it changed. `saved` (a
    checkpoint's `state()`) refills the controller's window, so a resumed run decides from its first round on. It
    acts on `rounds` (the learners a round invokes), `billing` (the counts charged), `crew` (serverful actors
    scaled) and `prewarm_actors` (serverless actor instances warmed, given the count)."""

    def __init__(
        self,
        cfg: TrainConfig,
        saved: Mapping[str, Any] | None = None,
        *,
        rounds: Rounds,
        billing: Billing,
        crew: ServerfulActors,
        prewarm_actors: Callable[[int], None],
    ) -> None:
        self.rounds, self.billing, self.crew, self.prewarm_actors = rounds, billing, crew, prewarm_actors
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

    def state(self, actors: int) -> dict[str, Any]:
        """What a checkpoint keeps: the actor count (`actors`, the config's) and the controller's window of
        demands."""
        demands = [] if self.controller is None else list(self.controller.demands)
        return {"actors": actors, "demands": demands}

    def begin_round(self, round_k: int, cfg: TrainConfig) -> TrainConfig:
        """The learner schedule's capacity for round `round_k`: the round protocol's learners, and under serverful
        billing the slots charged from now. Returns `cfg` with it (the pre-warm count's learners)."""
        learners = cfg.learners_at(round_k)
        if learners == self.rounds.learners:
            return cfg
        self.billing.charge_held(serverful_actors=bool(self.crew.procs))
        self.billing.learners = learners
        self.rounds.set_learners(learners)
        return cfg.model_copy(update={"learners": learners})

    def end_round(
        self,
        round_k: int,
        cfg: TrainConfig,
        batches: Sequence[tuple[str, BatchMeta]],
        duration_s: float,
        collect_s: float,
        *,
        queued: int,
        fired_version: int | None,
    ) -> tuple[dict[str, Any], TrainConfig]:
        """The round's signal to the controller, its count applied for the next round: the round's columns, and
        `cfg` with that count. `queued`: the batches waiting in the trajectory stream; `fired_version`: the version
        the learner trigger fired at. The billing is charged up to now already (stellaris/round/wiring.py), so a
        change is charged from now."""
        serverful = cfg.actor_kind == "serverful"
        actors, learners = cfg.actors, self.rounds.learners
        steps = float(sum(meta.env_steps for _, meta in batches))
        backlog_steps = queued * steps / max(1, len(batches))  # batches of one size
        held_s = duration_s if serverful else collect_s  # serverful actors are held all round, invocations collect
        columns: dict[str, Any] = {
            "learners": learners,
            "batch_wait_s": round(collect_s, 4),  # the learners idle since the last round's learning ended
            "backlog_steps": round(backlog_steps, 1),
            "batches_lost": self.sequence.lost(batches) if serverful else 0,
            "policy_lag": policy_lag(batches, fired_version),
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
            soon, after = cfg.learners_at(round_k + 1), cfg.learners_at(round_k + 2)
            wanted = self.controller.wanted(max(soon, after))
            columns["actor_demand"] = math.nan if wanted is None else round(wanted, 3)
            base, target = self.controller.decide(actors, soon), self.controller.decide(actors, max(soon, after))
            prewarmed = max(0, target - max(base, actors))
            if target != actors:
                self._apply(target, actors, serverful)
                cfg = cfg.model_copy(update={"actors": target})
                prewarmed = prewarmed if serverful else max(0, target - actors)  # serverless: every added instance
        return columns | {
            "actors": target,
            "actor_change": f"{target - actors:+d}" if target != actors else "0",
            "actors_prewarmed": prewarmed,
            "actor_cost_round_before": actor_cost_per_round(actors, held_s),
            "actor_cost_round_after": actor_cost_per_round(target, held_s),
        }, cfg

    def _apply(self, target: int, actors: int, serverful: bool) -> None:
        self.billing.actors = target
        if serverful:
            self.crew.scale(target)
        elif target > actors:  # instances warm before the next round invokes them
            self.prewarm_actors(target)
