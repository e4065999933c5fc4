"""The parameter function's apply step: one aggregation's gradients fitted to the policy (a poisoned one refused),
the optimizer's update on them, the aggregator's state after it and the applied log's row, ready for the atomic
publish (`PolicyStore.publish_and_ack`); the state a round boundary starts; and, as the invocation ends, the optimizer
state its publishes left out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from cache import CodecError, FencingError, GradientMeta, GradientRecord, JobCache, RecordError
from cache.policy_store import UpdateLease
from cache.streams import Entry
from contract import AggregatorState, AppliedGradient, AppliedRow
from contract.algo_config import AlgoConfig
from contract.jobspec import JobSpec, Plan
from contract.packed import PACKED
from functions.algos.lr_schedule import learning_rate
from functions.algos.registry import algorithm_of
from functions.algos.staleness import (
    AggregationRule,
    AggregationState,
    Decision,
    DecisionRecord,
    aggregation_rule,
    gradient_scales,
    observe,
)
from functions.algos.staleness_equations import optimizer_step_gradients
from functions.model.device import to_device
from functions.model.flat_params import flat_params
from functions.model.serialize import optimizer_to_bytes, policy_to_bytes
from functions.parameter.checks import moments_problem, tensors_problem
from functions.parameter.queue import Decided
from functions.parameter.setup import keep_warm, warm_model
from functions.runtime.context import Context, WarmModel
from functions.runtime.stopwatch import Stopwatch


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
            ids=[gid for gid, _ in used], record=record, weights=policy_to_bytes(self.model.policy, version=new),
            optimizer_state=optimizer_to_bytes(self.model.optimizer) if save else b"", state=after,
            row=applied_row(new, record, used),
        )  # fmt: skip

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
    model: WarmModel, cfg: AlgoConfig, plan: Plan, rule: AggregationRule, record: DecisionRecord,
    records: list[GradientRecord], device: torch.device,
) -> None:  # fmt: skip
    """One aggregation's update of the model (its `fitted` records): the optimizer steps on the scaled gradients at
    the round's learning rate, then the gradients' observation moments (a round's fresh batches) into the policy's
    normaliser."""
    lr = learning_rate(
        cfg.lr, cfg.lr_schedule, round_k=max(record.round_k, 1), horizon_rounds=plan.horizon_rounds,
        final_fraction=cfg.lr_final_fraction,
    )  # fmt: skip
    for group in model.optimizer.param_groups:
        group["lr"] = lr
    parts = [to_device(r.tensors, device) for r in records]
    scales = gradient_scales(rule, record.stalenesses[: record.count])
    for grads in optimizer_step_gradients(parts, scales, cfg.stellaris.optimizer_steps):
        for name, p in model.named:
            p.grad = grads[name]  # fresh tensors: the step may take them as they are
        model.optimizer.step()
    normalizer = model.policy.obs_normalizer
    for m in (r.obs_moments for r in records):
        if m is not None and normalizer is not None:
            normalizer.update_from_moments(m.mean, m.var, m.count)


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
