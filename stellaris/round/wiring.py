"""One round, wired in one place (as Sample Factory's `connect_components`): `connect_round` names every producer and
consumer of a round in the order its data flows, one line each,

    actors → trajectory stream → learner gate (the learner trigger) → learner tasks on the task board → learners
    → gradient stream → parameter function (the parameter trigger) → policy store → actors,

then the round's outputs (the run directory's rows) and the scaler. Each part gets the few inputs it needs and
returns what it changes; none sees the Trainer (stellaris/round/trainer.py), which keeps what lies between rounds
(the job's epoch, its counts, its checkpoint) and calls `connect_round` once a round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cache import JobCache
from contract import RoundShape
from stellaris.config import TrainConfig
from stellaris.platform.billing import Billing
from stellaris.platform.calls import Role
from stellaris.platform.serverful_actors import ServerfulActors
from stellaris.round.batches import Landed
from stellaris.round.evaluation import Evaluator
from stellaris.round.protocol import Intake, LearnerGate, Rounds, RoundStats, round_tasks
from stellaris.round.replay import ReplayRounds
from stellaris.round.scaling import Scaler
from stellaris.rundir.outputs import RunDir
from stellaris.rundir.progress import Standing
from stellaris.rundir.report import RoundFacts, episode_returns, gradient_rows, info_row, take_applied, timeline_rows
from stellaris.rundir.trigger_log import learner_row


class DeadLetters:
    """The task board's dead letters added since the last look (info.csv's `dead_lettered`)."""

    def __init__(self, job: JobCache) -> None:
        self.job, self.after = job, "0-0"

    def since_last(self) -> int:
        items = self.job.board.read_dead_letters(self.after)
        if items:
            self.after = items[-1][0]
        return len(items)


@dataclass(frozen=True)
class RoundParts:
    """A job epoch's producers and consumers, in the order a round's data flows through them (Trainer.setup)."""

    crew: ServerfulActors  # serverful actors, streaming all along (serverless ones: invoked by `rounds`)
    job: JobCache  # the streams: trajectories, the task board, gradients, the policy store and its applied log
    gate: LearnerGate  # the learner trigger over the trajectory stream
    replay: ReplayRounds  # replayed batches beside the fresh ones (cache/replay)
    shape: RoundShape  # a round's learner tasks: epochs x minibatches over its batches
    rounds: Rounds  # the round protocol: serverless actors, learners and the parameter function, invoked
    run: RunDir  # the outputs: the run directory's rows
    evaluator: Evaluator  # deterministic episodes of the round's policy, when due
    billing: Billing  # what the round's calls and held instances cost
    dead_letters: DeadLetters
    scaler: Scaler  # the learner schedule and elastic actors
    names: Mapping[Role, str]  # the job's functions, as the round's activations name them
    prewarm_learners: Callable[[int, float], None]  # (count, by_s): learner instances warm by the batch's landing
    round_trips: Callable[[], int]  # the control plane's own Redis round trips so far
    clock: Callable[[], float]  # the run's elapsed seconds (across resumes)


@dataclass(frozen=True)
class Played:
    """What a round leaves the next: its info row, the counts (`cfg`: learners by the schedule, actors by the
    elastic controller), the run's env steps, the batches claimed beyond the round's own, the landed actors' newest
    reward-scaler moments, and the seconds its collection took."""

    row: dict[str, Any]
    cfg: TrainConfig
    env_steps: int
    carried: list[Landed]
    reward_scalers: dict[str, list[float]]
    collect_s: float


def connect_round(
    p: RoundParts, k: int, cfg: TrainConfig, *, env_steps: int, carried: list[Landed], warm_by_s: float
) -> Played:
    """Round `k`, producer to consumer. `cfg` holds the counts the last round left, `env_steps` the run's steps so
    far, `carried` the batches the last round claimed beyond its own; `warm_by_s`: when learners should be warm."""
    cfg = p.scaler.begin_round(k, cfg)  # the scaler: the learner schedule's capacity for this round
    t0, trips0, rs = time.monotonic(), p.round_trips(), RoundStats()
    p.rounds.begin(k, rs)  # where actors ship gradients (gradients_at_actors), the parameter function starts now
    p.prewarm_learners(cfg.learners + cfg.standby, warm_by_s)  # learner instances, warm as the batch lands
    c0 = time.monotonic()
    if cfg.actor_kind == "serverless":
        p.rounds.invoke_actors(cfg.actors, rs)  # actors → trajectory stream (serverful ones stream all along)
    intake = Intake(k, p.shape.train_batch_size, cfg.actors, p.crew, p.job.policies.version)
    got = p.gate.collect(intake, carried, rs)  # trajectory stream → learner gate, claiming until its trigger fires
    p.run.triggers.write([learner_row(k, p.clock(), got.fired, got.ids)])  # the learner firing → triggers.csv
    collect_s, env_steps = time.monotonic() - c0, env_steps + got.env_steps
    trained = got.ids + p.replay.extend(k, got.batches)  # the fresh batches, then replayed ones
    tasks = round_tasks(k, trained, epochs=p.shape.num_epochs, minibatches=p.shape.num_minibatches)
    tasks = p.replay.weigh(tasks)  # learner tasks, with prioritized replay's importance weights
    p.rounds.learn(k, tasks, rs)  # task board → learners → gradient stream → parameter function → policy store
    p.job.trajectories.ack(got.ids)  # the round's batches leave the trajectory stream
    # policy store → actors: each actor samples its next batch with the newest version (functions/actor/loop.py)
    rs.redis_round_trips += p.round_trips() - trips0  # the control plane's own
    duration = time.monotonic() - t0
    # The outputs: the run directory's rows, the round's costs, then the scaler's count for the next round.
    steps_before = env_steps - got.env_steps
    p.run.timeline.write(timeline_rows(got.batches, steps_before=steps_before, now_s=p.clock(), now_unix=time.time()))
    applied = take_applied(p.job)  # the parameter function's aggregations since the last round (its applied log)
    p.run.gradients.write(gradient_rows(applied))  # → gradients.csv, and the parameter firings → triggers.csv
    last = Standing.of(cfg, elapsed_s=p.clock(), round_k=k, env_steps=env_steps).spent() is not None
    evaluated = _evaluated(p, k, rs, last=last)  # its calls are metered with the round's
    p.run.record_invocations(rs.activations)  # → invocations.csv
    p.billing.charge(rs.activations)
    p.billing.charge_held(serverful_actors=bool(p.crew.procs))
    facts = _facts(p, k, cfg, env_steps=env_steps, duration_s=duration, collect_s=collect_s)
    row = info_row(facts, rs, episode_returns(got.batches), applied) | evaluated
    queued = p.job.trajectories.stream.length()
    scaled, cfg = p.scaler.end_round(
        k, cfg, got.batches, duration, collect_s, queued=queued, fired_version=p.gate.fired_version
    )
    p.run.record_round(row | scaled)  # → info.csv and TensorBoard
    row = row | scaled | {"max_in_flight": rs.max_in_flight}
    return Played(row, cfg, env_steps, got.carried, got.reward_scalers, collect_s)


def _evaluated(p: RoundParts, k: int, rs: RoundStats, *, last: bool) -> dict[str, Any]:
    """When due, deterministic episodes of the policy the round ended with (stellaris.round.evaluation): its info-row
    columns; its calls join the round's activations."""
    if not p.evaluator.due(k, last=last):
        return {}
    columns, acts = p.evaluator.evaluate(k, p.job.policies.version())
    rs.activations += acts
    return columns


def _facts(
    p: RoundParts, k: int, cfg: TrainConfig, *, env_steps: int, duration_s: float, collect_s: float
) -> RoundFacts:
    return RoundFacts(
        round_k=k,
        duration_s=duration_s,
        actor_time_s=collect_s,
        actors=cfg.actors,
        envs_per_actor=cfg.envs_per_actor,
        env_steps=env_steps,
        learner_function=p.names["learner"],
        parameter_function=p.names["parameter"],
        cost_learner=p.billing.cost_learner,
        cost_actor=p.billing.cost_actor,
        dead_lettered=p.dead_letters.since_last(),
    )
