"""The parameter function's aggregation, between the read and the publish (no I/O of its own): what the rule decides on,
and the step it applies.

- Decide (`Queue`): the gradients read and not yet applied, in arrival order, and the job's trigger
  (docs/workflows.md) between them and the rule (`functions.algos.stellaris`).
- Apply (`Applier`): one aggregation's gradients fitted to the policy (a poisoned one refused), the optimizer's
  update on them, the aggregator's state after it and the applied log's row, ready for the atomic publish
  (`PolicyStore.publish_and_ack`); the state a round boundary starts; and, as the invocation ends, the optimizer state
  its publishes left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import torch

from cache import CodecError, FencingError, GradientMeta, GradientRecord, JobCache, RecordError
from cache.learner_registry import WorkSnapshot
from cache.policy_store import UpdateLease
from cache.streams import Entry
from cache.tasks import Landed
from contract import AggregatorState, AppliedGradient, AppliedRow
from contract.algo_config import AlgoConfig
from contract.jobspec import JobSpec, Plan
from contract.knobs import Rule
from contract.packed import PACKED
from contract.triggers import ParameterTrigger
from functions.algos.gap_aware import ParameterGaps
from functions.algos.lr_schedule import learning_rate
from functions.algos.registry import algorithm_of
from functions.algos.stellaris import (
    AggregationRule,
    AggregationState,
    Decision,
    DecisionRecord,
    QueueSnapshot,
    aggregation_rule,
    applies_from_queue_alone,
    decide,
    gradient_scales,
    observe,
    optimizer_step_gradients,
)
from functions.model.device import to_device
from functions.model.flat_params import flat_params
from functions.model.serialize import optimizer_to_bytes, policy_to_bytes
from functions.parameter.checks import moments_problem, tensors_problem
from functions.parameter.setup import keep_warm, warm_model
from functions.runtime.context import Context, WarmModel
from functions.runtime.stopwatch import Stopwatch

# --- decide ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """A decision to apply: the oldest queued gradients it takes, the rule's record, and the state it was made in."""

    used: list[tuple[str, GradientMeta]]
    record: DecisionRecord
    state: AggregationState


class Queue:
    """The gradients read and not yet applied: each one's header, which decisions use, and its entry, decoded only when
    it is aggregated. `until_round` (0: none): the invocation's round; gradients of later rounds (gradients_at_actors:
    actors run ahead) wait for their round's invocation, so a run of N rounds applies the gradients of rounds 1..N,
    whatever its actors computed ahead. The trigger shows the rule whole groups of K, the rest wait as if in flight
    (the default trigger shows it the whole queue); `owed`: the gradients of a firing the rule has not applied yet."""

    def __init__(
        self,
        rule: AggregationRule,
        trigger: ParameterTrigger,
        *,
        until_round: int = 0,
        sync_expected: int | None = None,
    ) -> None:
        self.rule, self.trigger, self.until_round, self.sync_expected = rule, trigger, until_round, sync_expected
        self.metas: dict[str, GradientMeta] = {}  # arrival order
        self.entries: dict[str, Entry] = {}
        self.owed, self.fired_at = 0, -math.inf
        # A rule that applies from the queue alone, behind the default trigger, may decide before it looks at the work
        # in flight: a round trip saved whenever it applies.
        self.from_queue_alone = applies_from_queue_alone(rule) and trigger == ParameterTrigger()

    def __len__(self) -> int:
        return len(self.metas)

    def add(self, landed: Landed) -> None:
        for entry, meta in landed.gradients:
            self.metas[entry.id], self.entries[entry.id] = meta, entry

    def remove(self, ids: Iterable[str]) -> None:
        for gid in ids:
            self.metas.pop(gid, None)
            self.entries.pop(gid, None)

    def visible(self) -> list[tuple[str, GradientMeta]]:
        """The gradients this invocation may apply: those of its round and earlier ones (all, without a round)."""
        return [(gid, m) for gid, m in self.metas.items() if not self.until_round or m.round <= self.until_round]

    def newest_round(self) -> int:
        """The newest round among the visible gradients (0 with none)."""
        return max((m.round for _, m in self.visible()), default=0)

    def in_flight(self, work: WorkSnapshot, version: int) -> tuple[tuple[int, ...], bool]:
        """Base versions of the tasks not yet turned into gradients, and whether the work is done: the round is closed
        and no task or gradient is left (but later rounds'). A task leaves the task stream only when its gradient is
        stored (or it is dead-lettered), so the stream's length counts them; tasks not (yet) held by a registered
        learner will use `version` (the newest) or a newer one."""
        held = sorted(work.held)[: work.tasks]
        later = len(self.metas) - len(self.visible())
        idle = work.tasks == 0 and work.gradients <= later and work.closed >= self.until_round
        return (*held, *([version] * (work.tasks - len(held)))), idle

    @property
    def since(self) -> float:
        """Seconds since the trigger last fired (inf before it first does)."""
        return time.monotonic() - self.fired_at

    def block_s(self, longest: float) -> float:
        """How long a wait for gradients may block: `longest`, or less until the period allows the next firing."""
        return min(longest, self.trigger.wait_s(self.since) or longest)

    def decide(self, state: AggregationState, version: int, in_flight: tuple[int, ...] | None) -> Decided | None:
        """The rule's decision on the queue behind the trigger, when it applies (else None). `in_flight`: the base
        versions of the work in flight; None: not looked at (unknown, at least one), when the rule sees the whole queue
        and only a decision to apply is acted on (the rule takes it whatever is in flight)."""
        queued = self.visible()
        versions = tuple(m.base_version for _, m in queued)
        if in_flight is None:
            seen, snapshot = len(queued), QueueSnapshot(version, versions, (version,))
        else:
            seen = self.trigger.visible(
                queued=len(queued), in_flight=len(in_flight), owed=self.owed, since_fire_s=self.since
            )
            self.fired_at = time.monotonic() if seen > self.owed else self.fired_at
            snapshot = QueueSnapshot(version, versions[:seen], in_flight + versions[seen:])
        record = decide(self.rule, state, snapshot, sync_expected=self.sync_expected)
        if in_flight is None and not record.applies:
            return None
        self.owed = seen - record.count if record.applies else seen
        return Decided(queued[: record.count], record, state) if record.applies else None


# --- apply ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """One aggregation applied to the model, to be published: its gradients, the rule's decision, the new version's
    weights, the optimizer state (empty between saves), the aggregator's state after it and the applied log's row."""

    ids: list[str]
    record: DecisionRecord
    weights: bytes
    optimizer_state: bytes
    state: AggregatorState
    row: AppliedRow


@dataclass(frozen=True)
class Poisoned:
    """A gradient whose payload cannot be applied: nothing was, and the rule decides again without it."""

    gradient_id: str
    reason: str


class Applier:
    """The policy and optimizer one invocation updates (its instance's warm ones, or as the store has them), the
    aggregator's state, and the updates since the optimizer state was last stored. The optimizer state (twice the
    weights for Adam) goes with every N-th publish (`JobLimits.optimizer_save_every`) and at the end of the
    invocation, not with each: a replacement after a crash resumes with weights exact and moments up to N-1 updates
    old; a warm instance keeps its own in memory."""

    def __init__(self, ctx: Context, job: JobCache, spec: JobSpec, optimizer_name: str) -> None:
        self.ctx, self.job, self.spec, self.optimizer_name, self.device = ctx, job, spec, optimizer_name, ctx.device
        self.rule: AggregationRule = aggregation_rule(spec.algo.stellaris, spec.plan)
        self.model = warm_model(ctx, job, spec, optimizer_name)
        self.state: AggregatorState = job.aggregator.get()
        self.unsaved = 0  # updates published without the optimizer state
        self.compute = Stopwatch()

    @property
    def version(self) -> int:
        return self.model.version

    @property
    def aggregation(self) -> AggregationState:
        """What the rule decides from: the round and δ_max."""
        return AggregationState(round_k=self.state.round_k, delta_max=self.state.delta_max)

    def start_round(self, newest: int) -> AggregatorState | None:
        """At a round boundary (gradients of round `newest` are queued): the state as the algorithm starts the round
        (PPO's KL coefficient, IMPACT's target network), which learners read with their next claim. Else None."""
        if newest <= self.state.round_k:
            return None
        cfg = self.spec.algo
        self.state = algorithm_of(cfg).start_round(self.state, cfg, new_round=newest, version=self.version)
        return self.state

    def apply(self, decided: Decided, entries: Mapping[str, Entry]) -> Update | Poisoned:
        """The model updated by the decided aggregation (the gradients' `entries` decoded here), and what its publish
        stores; a payload that cannot be decoded or does not fit the policy is `Poisoned` instead, and nothing is
        updated."""
        used, record = decided.used, decided.record
        records = []
        for gid, _ in used:
            try:
                records.append(fitted(self.model, self.job.gradients.record(entries[gid])))
            except (CodecError, RecordError) as exc:
                return Poisoned(gid, f"payload unusable: {type(exc).__name__}: {exc}")
        with self.compute:
            update(self.model, self.spec.algo, self.spec.plan, self.rule, record, records, self.device)
        kls = [float(m.stats["approx_kl"]) for _, m in used if "approx_kl" in m.stats]
        after = self.state.with_(
            delta_max=observe(decided.state, record).delta_max,
            aggregations=self.state.aggregations + 1,
            flushes=self.state.flushes + (record.decision is Decision.FLUSH),
            kl_sum=self.state.kl_sum + sum(kls),
            kl_n=self.state.kl_n + len(kls),
        )
        save = self.unsaved + 1 >= self.job.limits.optimizer_save_every
        new = self.version + 1
        return Update(
            ids=[gid for gid, _ in used],
            record=record,
            weights=policy_to_bytes(self.model.policy, version=new),
            optimizer_state=optimizer_to_bytes(self.model.optimizer) if save else b"",
            state=after,
            row=applied_row(new, record, used),
        )

    def published(self, update: Update, version: int) -> None:
        """`update` is published as `version`."""
        self.model.version, self.state = version, update.state
        self.unsaved = 0 if update.optimizer_state else self.unsaved + 1

    def close(self, lease: UpdateLease) -> bool:
        """As the invocation ends: store the optimizer state its last publishes left out and keep the model warm for
        the instance's next invocation. False when the lease was lost meanwhile (fenced): nothing is kept."""
        if self.unsaved:
            try:
                blob = optimizer_to_bytes(self.model.optimizer)
                self.job.policies.save_optimizer(lease, version=self.version, optimizer_state=blob)
            except FencingError:
                return False
            self.unsaved = 0
        keep_warm(self.ctx, self.job, self.optimizer_name, self.model)
        return True


def fitted(model: WarmModel, record: GradientRecord) -> GradientRecord:
    """`record` with its tensors as the model's optimizer steps them: packed for a packed policy (either way they
    travelled). A gradient that does not fit the policy (other parameter names or shapes, values that are not finite,
    observation moments its normaliser cannot take) raises `RecordError`, naming how: poison, as an unreadable one,
    and nothing is applied."""
    fp = flat_params(model.policy)
    try:
        record = record if fp is None else replace(record, tensors={PACKED: fp.pack(record.tensors)})
    except ValueError as exc:
        raise RecordError(f"gradient {record.meta.task_id!r} from {record.meta.learner_id!r}: {exc}") from exc
    problem = tensors_problem(record.tensors, {name: tuple(p.shape) for name, p in model.named})
    normalizer, m = model.policy.obs_normalizer, record.obs_moments
    if problem is None and m is not None:
        problem = moments_problem(m.mean, m.var, m.count, None if normalizer is None else tuple(normalizer.mean.shape))
    if problem is not None:
        raise RecordError(f"gradient {record.meta.task_id!r} from {record.meta.learner_id!r}: {problem}")
    return record


def update(
    model: WarmModel,
    cfg: AlgoConfig,
    plan: Plan,
    rule: AggregationRule,
    record: DecisionRecord,
    records: list[GradientRecord],
    device: torch.device,
) -> None:
    """One aggregation's update of the model (its `fitted` records): the optimizer steps on the scaled gradients at
    the round's learning rate, then the gradients' observation moments (a round's fresh batches) into the policy's
    normaliser."""
    lr = learning_rate(
        cfg.lr,
        cfg.lr_schedule,
        round_k=max(record.round_k, 1),
        horizon_rounds=plan.horizon_rounds,
        final_fraction=cfg.lr_final_fraction,
    )
    for group in model.optimizer.param_groups:
        group["lr"] = lr
    parts = [to_device(r.tensors, device) for r in records]
    scales = gradient_scales(rule, record.stalenesses[: record.count])
    gaps = _gaps(model, cfg) if rule.rule is Rule.STELLARIS and cfg.stellaris.staleness_penalty == "distance" else None
    if gaps is not None:
        parts, scales = _distance_scaled(model, gaps, records, parts, scales)
    for grads in optimizer_step_gradients(parts, scales, cfg.stellaris.optimizer_steps):
        for name, p in model.named:
            p.grad = grads[name]  # fresh tensors: the step may take them as they are
        model.optimizer.step()
    if gaps is not None:
        gaps.record(model.version + 1, [p for _, p in model.named])
    normalizer = model.policy.obs_normalizer
    for m in (r.obs_moments for r in records):
        if m is not None and normalizer is not None:
            normalizer.update_from_moments(m.mean, m.var, m.count)


def _gaps(model: WarmModel, cfg: AlgoConfig) -> ParameterGaps:
    """The model's published parameters for the distance penalty, started with the version it holds (a cold instance
    knows no older one: their gradients fall back to the version count)."""
    if model.gaps is None or model.gaps.keep != cfg.stellaris.gap_history:
        model.gaps = ParameterGaps(keep=cfg.stellaris.gap_history)
    if model.gaps.newest() != model.version:
        model.gaps.history.clear()  # reloaded from the cache: what it kept may not be this line of versions
        model.gaps.record(model.version, [p for _, p in model.named])
    return model.gaps


def _distance_scaled(
    model: WarmModel,
    gaps: ParameterGaps,
    records: list[GradientRecord],
    parts: list[dict[str, torch.Tensor]],
    scales: list[float],
) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Each gradient divided by its gap penalty, its version-count scale dropped; one whose base version is not kept
    keeps its version-count scale."""
    current = [p for _, p in model.named]
    out_parts, out_scales = [], []
    for r, part, scale in zip(records, parts, scales, strict=True):
        penalty = gaps.penalties(r.meta.base_version, current)
        if penalty is None:
            out_parts.append(part)
            out_scales.append(scale)
            continue
        out_parts.append({name: part[name] / g for (name, _), g in zip(model.named, penalty, strict=True)})
        out_scales.append(1.0)
    return out_parts, out_scales


def applied_row(version: int, record: DecisionRecord, used: list[tuple[str, GradientMeta]]) -> AppliedRow:
    """The applied log's row for one aggregation: the version it made and each gradient that went into it."""
    return AppliedRow(
        version=version,
        decision=record.decision.value,
        round=record.round_k,
        threshold=record.threshold,
        gradients=[
            AppliedGradient(gid, m.task_id, m.round, m.base_version, delta)
            for (gid, m), delta in zip(used, record.stalenesses, strict=False)
        ],
    )
