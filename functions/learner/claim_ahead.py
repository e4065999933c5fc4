"""Claiming ahead: a learner's next claim (the round trip that stores its last gradient with the task's ack and takes
the next task) is sent before the learner computes the task it holds and read once it has (`cache.deferred`): Redis
runs it meanwhile, and its reply waits in the socket, so the round trip is off the computation's path. The claimed
task's policies are loaded after the read. (A thread that made the claim cost more: its wake-ups across the two
cores and its contention for the interpreter lock; docs/algorithms.md.)

The claimed task's policy is then the newest when the claim ran, one gradient earlier than a claim made after the
computation: about one version staler. Sync's learners never claim ahead: each computes one task of a step, and
one claiming ahead would take another's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from cache import Claim, GradientRecord, JobCache
from cache.tasks import PendingClaim
from contract.jobspec import JobSpec
from functions.algos.algorithm import LearnInputs
from functions.learner.gradient import task_inputs
from functions.model.policies import ActorCritic
from functions.runtime.context import Context

Finished = tuple[str, GradientRecord]  # a computed task's id and gradient, stored with the next claim


@dataclass(frozen=True)
class Next:
    """A claim's outcome: the claim, the claimed task's policy with what its gradient takes besides (None without a
    task), and the gradient the claim carried (stored, or lost when `claim.lost`)."""

    claim: Claim
    inputs: tuple[ActorCritic, LearnInputs] | None
    carried: GradientRecord | None

    def policies(self) -> Iterable[ActorCritic]:
        """The modules a computation of this task uses: not to be reloaded while it runs."""
        if self.inputs is None:
            return ()
        policy, inputs = self.inputs
        return (policy, *inputs.others, *([inputs.target] if inputs.target is not None else []))


def claims_ahead(spec: JobSpec) -> bool:
    stellaris = spec.algo.stellaris
    return stellaris.claim_ahead and stellaris.rule != "sync"


class Ahead:
    """One learner invocation's claims: `now` claims at once; `start` sends a claim (when claiming ahead) and
    `after` reads it. One claim at a time."""

    def __init__(self, ctx: Context, job: JobCache, spec: JobSpec, learner_id: str, enabled: bool) -> None:
        self.ctx, self.job, self.spec, self.learner_id = ctx, job, spec, learner_id
        self.enabled = enabled
        self._sent: tuple[PendingClaim, Finished | None, Next] | None = None

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        sent, self._sent = self._sent, None
        if sent is not None:
            # A claim in flight is read before the learner leaves (its lease dropped); its failure is no news to a
            # learner already leaving on an error of its own, as a claiming thread's was not.
            with contextlib.suppress(Exception):
                sent[0].result()

    def _send(self, held: int | None, finished: Finished | None, holding: Next | None, *, now: bool) -> PendingClaim:
        return self.job.board.send_claim(
            self.learner_id,
            held_version=held,
            finished=finished,
            holding=holding.claim.task.id if holding is not None and holding.claim.task is not None else None,
            timeout_s=self.job.limits.backpressure_timeout_s,
            now=now,
        )

    def _next(self, claim: Claim, finished: Finished | None, holding: Next | None) -> Next:
        inputs = None
        if claim.task is not None:
            inputs = task_inputs(
                self.ctx,
                self.job,
                self.spec,
                version=claim.version,
                weights=claim.weights,
                held=claim.held,
                holder=self.learner_id,
                kl_coef=claim.kl_coef,
                target_version=claim.target_version,
                keep=tuple(holding.policies()) if holding is not None else (),
            )
        return Next(claim, inputs, finished[1] if finished is not None else None)

    def now(self, *, held: int | None, finished: Finished | None) -> Next:
        assert self._sent is None, "a claim is in flight"
        return self._next(self._send(held, finished, None, now=True).result(), finished, None)

    def start(self, *, held: int | None, finished: Finished | None, holding: Next) -> None:
        """Send a claim while `holding`'s task is computed; without claiming ahead, nothing (a gradient is then
        always stored by the claim `after` makes)."""
        assert self._sent is None, "a claim is in flight"
        if not self.enabled:
            assert finished is None, "without claiming ahead a gradient is stored by the claim after it"
            return
        self._sent = (self._send(held, finished, holding, now=False), finished, holding)

    def after(self, *, held: int | None, done: Finished | None) -> tuple[Next, Finished | None]:
        """Once a task is computed (`done`: its gradient, None when it was dead-lettered): the next claim, and the
        gradient still to store. Claiming ahead, that is the claim `start` sent, and `done` waits for the next one;
        else a claim now, which stores `done`."""
        sent, self._sent = self._sent, None
        if sent is None:
            return self.now(held=held, finished=done), None
        pending, finished, holding = sent
        return self._next(pending.result(), finished, holding), done
