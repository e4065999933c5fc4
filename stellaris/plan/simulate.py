"""The scale model's simulation (docs/scale-model.md): an N-learner run of a job on a virtual clock, every gradient
computed for real, in this one process, by the functions' own code.

What is real: the actors' rollouts (`functions/actor/rollout.py` on the job's Gymnasium envs, seeded as the actor
handler seeds them), the round's data and each task's gradient (the algorithm's `prepare`/`with_policy` per learner
instance and round, `functions/learner/gradient.py`'s `gradient_record`, truncating against the versions the other
learners hold), the parameter function's rule and apply (`functions/algos/stellaris.py`'s `decide`/`observe`,
`functions/parameter/aggregation.py`'s `fitted`/`update`, the algorithm's `start_round`), the published weights
(`policy_to_bytes`, the newest `keep_versions` kept as the policy store keeps them) and the returns. What is modelled:
when each of it happens (`events.run_round` with `latency.ClusterLatency`), and so the wall-clock and the cost
(`cost.round_cost`). The control plane imports this module only for `stellaris plan`, as it imports the offline
evaluator for `stellaris eval` (docs/architecture.md).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cache import GradientRecord, JobLimits
from contract import AggregatorState
from contract.jobspec import env_kind
from contract.records import LearnerTask
from functions.actor.envs import make_vector_env
from functions.actor.evaluation import run_episodes
from functions.actor.rollout import ClippedRewards, EpisodeTracker, RewardScaler, collect
from functions.actor.state import ActorState
from functions.algos.algorithm import LearnInputs
from functions.algos.registry import algorithm_of
from functions.algos.stellaris import AggregationState, Decision, QueueSnapshot, aggregation_rule, decide, observe
from functions.learner.claim_ahead import claims_ahead
from functions.learner.gradient import gradient_record
from functions.model.device import to_device
from functions.model.flat_params import flat_params
from functions.model.policies import ActorCritic
from functions.model.serialize import build_optimizer, load_policy_bytes, policy_to_bytes
from functions.model.warm import new_policy
from functions.parameter.aggregation import fitted, update
from functions.runtime.context import Context, Instance, WarmModel
from functions.runtime.stopwatch import Stopwatch
from stellaris.plan import events
from stellaris.plan.cost import round_cost
from stellaris.plan.events import Landing, RoundTrace, Start
from stellaris.plan.job import PlanJob
from stellaris.plan.latency import ClusterLatency, ready_times
from stellaris.plan.report import RoundRow
from stellaris.round.evaluation import EVAL_SEED_OFFSET
from stellaris.round.protocol import round_steps, round_tasks

CPU = torch.device("cpu")  # the model computes on this machine's CPU (docs/scale-model.md#limits)
ACTOR_SEED_STRIDE = 7919  # actor i's envs and sampling are seeded seed + 7919·i, as functions/handlers/actor.py does


class Versions:
    """The published versions' weights, as the policy store keeps them: the newest `keep` and any a learner still has
    a task on (a real learner loaded those when it claimed); and policy modules loaded with them, for the versions
    other learners hold (truncation) and the target network. A version retired past the newest `keep` is not `kept`:
    truncation then leaves it out, as a learner that cannot load it does."""

    def __init__(self, build: Callable[[], ActorCritic], keep: int) -> None:
        self.build, self.keep = build, keep
        self.blobs: dict[int, bytes] = {}
        self.modules: OrderedDict[int, ActorCritic] = OrderedDict()
        self.capacity = keep + 2  # the kept versions a task truncates against, its target, and one spare

    @property
    def newest(self) -> int:
        return max(self.blobs)

    def publish(self, version: int, blob: bytes, held: Collection[int] = ()) -> None:
        self.blobs[version] = blob
        floor = version - self.keep
        for old in [v for v in self.blobs if v <= floor and v not in held]:
            del self.blobs[old]

    def kept(self, version: int) -> bool:
        return version in self.blobs and version > self.newest - self.keep

    def blob(self, version: int) -> bytes:
        return self.blobs[version]

    def module(self, version: int) -> ActorCritic:
        """A policy module with `version`'s weights, the least recently used one reloaded once all are in use."""
        if version in self.modules:
            self.modules.move_to_end(version)
            return self.modules[version]
        policy = self.modules.popitem(last=False)[1] if len(self.modules) >= self.capacity else self.build()
        load_policy_bytes(policy, self.blobs[version])
        self.modules[version] = policy
        return policy


@dataclass
class LearnerInstance:
    """One modelled learner's warm instance: its own policy module and the version loaded in it, and its round's data
    (prepared on its first task of the round, completed with that task's policy)."""

    policy: ActorCritic
    version: int = -1
    data: Any = None


@dataclass
class Round:
    """One round's work for the event core (`events.Work`): the real gradients and the parameter function's real rule
    and apply, and what the round's row counts."""

    sim: Simulation
    round_k: int
    tasks: list[LearnerTask]
    batches: list[dict[str, np.ndarray]]
    prepared: Any
    prepare_s: float
    computed: dict[int, GradientRecord] = field(default_factory=dict)
    queue: list[GradientRecord] = field(default_factory=list)
    stalenesses: list[int] = field(default_factory=list)
    aggregations: int = 0
    flushes: int = 0
    compute_s: float = 0.0
    apply_s: float = 0.0

    def compute(self, start: Start) -> float:
        """The task's gradient, now, on the version its learner holds: its measured seconds (its first task of the
        round also pays for preparing the round's data, as a learner instance does)."""
        sim, spec = self.sim, self.sim.job.spec
        learner, watch = sim.learners[start.learner], Stopwatch()
        with watch:
            if learner.version != start.version:  # a learner reloads weights only when its version changed
                load_policy_bytes(learner.policy, sim.versions.blob(start.version))
                learner.version = start.version
            if start.first:
                learner.data = sim.algo.with_policy(self.prepared, learner.policy, spec.algo)
        inputs = LearnInputs(
            others=[sim.versions.module(v) for v in start.others if sim.versions.kept(v)],
            target=sim.target(learner.policy, start.version),
            kl_coef=sim.state.kl_coef,
            seed=spec.seed,
        )
        task = self.tasks[start.task]
        self.computed[start.task] = gradient_record(
            spec,
            learner.policy,
            learner.data,
            self.batches,
            task,
            inputs,
            task_id=f"{self.round_k}:{task.epoch}:{task.minibatch}",
            learner_id=f"learner-{start.learner}",
            base_version=start.version,
            device=str(CPU),
            compute=watch,
        )
        measured = watch.seconds + (self.prepare_s if start.first else 0.0)
        self.compute_s += measured
        return measured if sim.timing.task_s is None else sim.timing.task_s

    def land(self, landing: Landing) -> None:
        self.queue.append(self.computed.pop(landing.task))

    def queued(self) -> int:
        return len(self.queue)

    def decide(self, version: int, in_flight: tuple[int, ...]) -> float | None:
        """The parameter function's decision on the queue, and when it applies, the apply: the model updated and the
        next version's weights stored. Returns the apply's modelled seconds: as measured (or the job's fixed ones,
        plus the latency model's cost of each gradient after the first), plus its overhead (None: nothing applied)."""
        sim, spec = self.sim, self.sim.job.spec
        if self.round_k > sim.state.round_k:  # the first decision of a round starts it, as the parameter function does
            sim.state = sim.algo.start_round(sim.state, spec.algo, new_round=self.round_k, version=version)
        aggregation = AggregationState(round_k=sim.state.round_k, delta_max=sim.state.delta_max)
        snapshot = QueueSnapshot(version, tuple(r.meta.base_version for r in self.queue), in_flight)
        record = decide(sim.rule, aggregation, snapshot)
        if not record.applies:
            return None
        used, self.queue = self.queue[: record.count], self.queue[record.count :]
        watch = Stopwatch()
        with watch:
            update(sim.model, spec.algo, spec.plan, sim.rule, record, [fitted(sim.model, r) for r in used], CPU)
            blob = policy_to_bytes(sim.model.policy, version=version + 1)
        kls = [float(r.meta.stats["approx_kl"]) for r in used if "approx_kl" in r.meta.stats]
        sim.state = sim.state.with_(
            delta_max=observe(aggregation, record).delta_max,
            aggregations=sim.state.aggregations + 1,
            flushes=sim.state.flushes + (record.decision is Decision.FLUSH),
            kl_sum=sim.state.kl_sum + sum(kls),
            kl_n=sim.state.kl_n + len(kls),
        )
        sim.model.version = version + 1
        sim.versions.publish(version + 1, blob, held=in_flight)
        self.stalenesses += record.stalenesses[: record.count]
        self.aggregations += 1
        self.flushes += record.decision is Decision.FLUSH
        self.apply_s += watch.seconds
        model = sim.latency.model
        fixed = sim.timing.apply_s
        applied_s = watch.seconds if fixed is None else fixed + (record.count - 1) * model.apply_per_gradient_s
        return applied_s + model.apply_overhead_s


@dataclass(frozen=True)
class Timing:
    """A round's fixed seconds (None: measured): a task's compute, a batch's collection, an apply, and a task's
    overhead (None: the latency model's); and its start, before the learners' first claims (a calibration's)."""

    task_s: float | None = None
    collect_s: float | None = None
    apply_s: float | None = None
    task_overhead_s: float | None = None
    start_s: float = 0.0


@dataclass(frozen=True)
class Collected:
    """A round's batches (actor order), each actor's collection seconds (measured, or the job's fixed ones), and
    the training episodes that ended."""

    batches: list[dict[str, np.ndarray]]
    seconds: list[float]
    returns: list[float]


@dataclass(frozen=True)
class RoundTimes:
    """A round on the virtual clock: its start, its batch's landing, when its learners are invoked (the parameter
    function with them), and how many learner instances started cold."""

    started: float
    landed: float
    invoked: float
    cold_starts: int


class Simulation:
    """One modelled run (`PlanJob`) on its virtual clock: the job created as the parameter function creates it (the
    seeded initial policy is version 0, and its Adam), the actors as the actor handler makes them, N learner
    instances, and the cluster's latency draws. `run_round` runs the next round; `close` closes the envs."""

    def __init__(self, job: PlanJob) -> None:
        self.job, self.spec = job, job.spec
        self.ctx = Context("plan", Instance())  # no cache: nothing here connects one
        self.algo = algorithm_of(self.spec.algo)
        self.rule = aggregation_rule(self.spec.algo.stellaris, self.spec.plan)
        torch.manual_seed(self.spec.seed)  # as the job's creation seeds version 0 (functions/parameter/setup.py)
        policy = self._policy()
        params = [fp.flat] if (fp := flat_params(policy)) is not None else list(policy.parameters())
        optimizer = build_optimizer("adam", params, lr=self.spec.algo.lr, adam_eps=self.spec.algo.adam_eps)
        self.model = WarmModel(0, policy, optimizer)
        self.state = AggregatorState()
        self.versions = Versions(self._policy, JobLimits().keep_versions)
        self.versions.publish(0, policy_to_bytes(policy, version=0))
        self.version = 0
        self.actors = [self._actor(i) for i in range(job.actors)]
        self.learners = [LearnerInstance(self._policy()) for _ in range(job.learners)]
        self.latency = ClusterLatency.draw(job.latency, job.learners, self.spec.seed)
        self.timing = Timing(job.task_s, job.collect_s, job.apply_s)  # this round's (`_timing`)
        self.clock = self.cost_learner = self.cost_actor = 0.0
        self.env_steps = 0
        self.round_k = 0

    def _policy(self) -> ActorCritic:
        return new_policy(self.ctx, self.spec, device=CPU)

    def _actor(self, index: int) -> ActorState:
        """Actor `index` as the actor handler makes it on its first invocation (functions/handlers/actor.py)."""
        spec = self.spec
        seed = spec.seed + ACTOR_SEED_STRIDE * index
        envs = make_vector_env(
            spec.env_id, spec.num_envs, seed=seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module
        )
        obs, _ = envs.reset(seed=seed)
        normalized = RewardScaler.for_envs(spec.num_envs, spec.algo.gamma) if spec.algo.normalize_reward else None
        scaler = ClippedRewards(then=normalized) if env_kind(spec.env_id) == "atari" else normalized
        rng = torch.Generator().manual_seed(seed)
        return ActorState(envs, obs, EpisodeTracker.for_envs(spec.num_envs), self._policy(), scaler, rng)

    def target(self, policy: ActorCritic, version: int) -> ActorCritic | None:
        """The target network a task computes with (algorithms that have one): the aggregator's target version when
        it is still kept, else the task's own policy (functions/learner/gradient.py)."""
        if not self.algo.uses_target(self.spec.algo):
            return None
        chosen = self.state.target_version if self.state.target_version is not None else version
        return self.versions.module(chosen) if self.versions.kept(chosen) else policy

    def collect(self) -> Collected:
        """Each actor's batch with the newest policy (actors collect between rounds), one after another here; in the
        model they collect side by side."""
        batches, seconds, returns = [], [], []
        for actor in self.actors:
            watch = Stopwatch()
            with watch:
                if actor.version != self.version:
                    load_policy_bytes(actor.policy, self.versions.blob(self.version))
                    actor.version = self.version
                arrays, actor.obs = collect(
                    actor.policy,
                    actor.envs,
                    actor.obs,
                    actor.tracker,
                    self.spec.actor_steps,
                    actor.reward_scaler,
                    generator=actor.rng,
                )
            batches.append(arrays)
            seconds.append(watch.seconds if self.timing.collect_s is None else self.timing.collect_s)
            returns += actor.tracker.take()[0]
        return Collected(batches, seconds, returns)

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> tuple[Any, float]:
        """The round's data as every learner instance prepares it (`Algorithm.prepare`), once here; its measured
        seconds are paid by each learner's first task."""
        watch = Stopwatch()
        with watch:
            prepared = to_device(self.algo.prepare(batches, self.spec.algo), CPU)
        return prepared, watch.seconds

    def _timing(self) -> Timing:
        """This round's fixed timings: the job's, or one calibration round's drawn for it (`PlanJob.round_timings`);
        None where measured."""
        job = self.job
        drawn = self.latency.round_timing(job.round_timings)
        if drawn is None:
            return Timing(job.task_s, job.collect_s, job.apply_s)
        return Timing(drawn.compute_s, drawn.collect_s, drawn.apply_s, drawn.task_overhead_s, drawn.start_s)

    def run_round(self) -> RoundRow:
        self.round_k += 1
        k, spec, started = self.round_k, self.spec, self.clock
        self.timing = self._timing()
        collected = self.collect()
        landed = started + max(collected.seconds)
        batch_ids = [f"actor-{i}-round-{k}" for i in range(len(self.actors))]
        tasks = round_tasks(k, batch_ids, epochs=spec.algo.num_epochs, minibatches=spec.algo.num_minibatches)
        steps = [len(step) for step in round_steps(tasks, mode=self.rule.rule, learners=self.job.learners)]
        prepared, prepare_s = self.prepare(collected.batches)
        work = Round(self, k, tasks, collected.batches, prepared, prepare_s)
        cold = self.latency.cold(k)
        ready = [t + self.timing.start_s for t in ready_times(self.latency.model, cold, landed, started)]
        # Round 1 waits for its learners to be warm before it invokes them, as stellaris/round/trainer.py does.
        times = RoundTimes(started, landed, invoked=min(ready) if k == 1 else landed, cold_starts=sum(cold))
        trace = events.run_round(
            work,
            steps=steps,
            ready=ready,
            stretch=lambda learner, measured_s: self.latency.task_seconds(
                learner, measured_s, self.timing.task_overhead_s
            ),
            version=self.version,
            claim_ahead=claims_ahead(spec),
            enqueued_at=times.invoked,
        )
        self.version = trace.published[-1].version if trace.published else self.version
        self.clock = trace.end
        self.env_steps += self.job.env_steps_per_round
        return self._row(work, trace, collected, times)

    def _row(self, work: Round, trace: RoundTrace, collected: Collected, times: RoundTimes) -> RoundRow:
        job, started, landed = self.job, times.started, times.landed
        duration = self.clock - started
        cost = round_cost(
            billing=job.billing,
            actor_kind=job.actor_kind,
            actors=job.actors,
            round_s=duration,
            actor_s=collected.seconds,
            learner_s=[max(0.0, trace.last_landing - r) for r in trace.ready],
            parameter_s=self.clock - times.invoked,
        )
        self.cost_learner += cost.learner
        self.cost_actor += cost.actor
        evaluated = self.evaluate() if job.eval_due(self.round_k) else []
        deltas = work.stalenesses
        return RoundRow(
            round_id=self.round_k,
            learners=job.learners,
            env_steps=self.env_steps,
            wall_clock_s=self.clock,
            duration=duration,
            actor_time=landed - started,
            learn_time=self.clock - landed,
            cost=self.cost_learner + self.cost_actor,
            cost_learner=self.cost_learner,
            cost_actor=self.cost_actor,
            train_reward_mean=_mean(collected.returns),
            episodes=len(collected.returns),
            eval_reward_mean=_mean(evaluated),
            eval_episodes=len(evaluated),
            staleness_mean=_mean(deltas),
            staleness_max=float(max(deltas)) if deltas else math.nan,
            gradients_applied=len(deltas),
            aggregations=work.aggregations,
            flushes=work.flushes,
            cold_starts=times.cold_starts,
            learner_compute_time=work.compute_s,
            parameter_compute_time=work.apply_s,
        )

    def evaluate(self) -> list[float]:
        """Deterministic episodes of the newest version on an env of its own, seeded as a real run's evaluations are
        (stellaris/round/evaluation.py); outside the modelled clock."""
        spec, seed = self.spec, self.spec.seed + EVAL_SEED_OFFSET
        env = make_vector_env(spec.env_id, 1, seed=seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module)
        try:
            policy = self.versions.module(self.version)
            episodes = self.job.eval_episodes
            return run_episodes(
                policy, env, episodes=episodes, seed=seed, max_episode_steps=self.job.eval_max_episode_steps
            ).returns
        finally:
            env.close()

    def close(self) -> None:
        for actor in self.actors:
            actor.envs.close()


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


@contextmanager
def simulation(job: PlanJob) -> Iterator[Simulation]:
    sim = Simulation(job)
    try:
        yield sim
    finally:
        sim.close()


def simulate(job: PlanJob, on_round: Callable[[RoundRow], None] | None = None) -> list[RoundRow]:
    """Every round of `job`, in order; `on_round` is called with each row as it is made (progress)."""
    rows = []
    with simulation(job) as sim:
        for _ in range(job.rounds):
            rows.append(sim.run_round())
            if on_round is not None:
                on_round(rows[-1])
    return rows
