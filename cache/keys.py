"""Every Redis key name Stellaris uses, in one place.

Keys of one job share the Redis Cluster hash tag ``{job}`` so that multi-key scripts and transactions stay in
one slot (docs/architecture.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_JOB_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
PREFIX = "stl"


def validate_job_id(job: str) -> str:
    if not isinstance(job, str) or not _JOB_RE.match(job):
        raise ValueError(f"invalid job id {job!r}: use 1-64 characters from letters, digits, '_', '.', '-'")
    return job


@dataclass(frozen=True)
class JobKeys:
    """Key names of one training job."""

    job: str

    def __post_init__(self) -> None:
        validate_job_id(self.job)

    @property
    def base(self) -> str:
        return f"{PREFIX}:{{{self.job}}}"

    def _k(self, name: str) -> str:
        return f"{self.base}:{name}"

    # Streams and their "space freed" notification lists (backpressure wakes producers through these).
    @property
    def traj(self) -> str:
        return self._k("traj")

    @property
    def grad(self) -> str:
        return self._k("grad")

    @property
    def tasks(self) -> str:
        return self._k("tasks")

    def freed(self, stream_key: str) -> str:
        return f"{stream_key}:freed"

    @property
    def tasks_wake(self) -> str:
        """List pushed when tasks are enqueued or finished, or a round closes: idle learners block on it."""
        return self._k("tasks:wake")

    @property
    def tasks_closed(self) -> str:
        """The newest round whose tasks are all enqueued."""
        return self._k("tasks:closed")

    @property
    def dead_letters(self) -> str:
        """Bounded stream of tasks and gradients given up on, with the reason."""
        return self._k("deadletters")

    @property
    def applied(self) -> str:
        """Stream with one entry per applied aggregation (gradient ids, task ids, base and applied versions)."""
        return self._k("applied")

    @property
    def control(self) -> str:
        """Stream of control events for the parameter function (stop, wake)."""
        return self._k("control")

    @property
    def actor_scalers(self) -> str:
        """Hash actor id -> JSON [mean, var, count] of its reward scaler, put there on resume from the checkpoint."""
        return self._k("actor:scalers")

    @property
    def actor_beats(self) -> str:
        """Hash actor id -> the count a serverful actor's heartbeat raises every second (the control plane's watch)."""
        return self._k("actor:beats")

    # Policy store.
    @property
    def policy_version(self) -> str:
        return self._k("policy:version")

    def policy(self, version: int) -> str:
        return self._k(f"policy:{int(version)}")

    @property
    def policy_events(self) -> str:
        return self._k("policy:events")

    @property
    def optim(self) -> str:
        return self._k("optim")

    @property
    def update_lock(self) -> str:
        return self._k("policy:lock")

    @property
    def update_fence(self) -> str:
        return self._k("policy:fence")

    # In-flight learners: learner id -> held version, and learner id -> lease deadline (ms).
    @property
    def learners(self) -> str:
        return self._k("learners")

    @property
    def learner_deadlines(self) -> str:
        return self._k("learners:deadline")

    @property
    def gradient_pushers(self) -> str:
        """gradients_at_actors: actor id -> the task id of its last stored gradient (a retried push stores nothing)."""
        return self._k("grad:pushers")

    @property
    def spec(self) -> str:
        """The job's specification (JSON), written once by whoever creates the job."""
        return self._k("spec")

    # Parameter-function state (round counter, delta_max, decision log) lives beside the policy.
    @property
    def aggregator(self) -> str:
        return self._k("aggregator")

    @property
    def decisions(self) -> str:
        return self._k("decisions")

    def replay(self, part: str) -> str:
        """The replay store's keys (cache/replay/store.py): data, index, order, actors, priority, state."""
        return self._k(f"replay:{part}")

    def pattern(self) -> str:
        """Glob matching every key of this job (for cleanup of this job only, never FLUSHALL)."""
        return f"{self.base}:*"


@dataclass(frozen=True)
class GatewayKeys:
    """Key names of one gateway deployment (shared by all of its workers)."""

    namespace: str = "gateway"

    def __post_init__(self) -> None:
        validate_job_id(self.namespace)

    @property
    def base(self) -> str:
        return f"{PREFIX}:gw:{{{self.namespace}}}"

    @property
    def functions(self) -> str:
        """Hash: function name -> spec JSON."""
        return f"{self.base}:functions"

    def activation(self, activation_id: str) -> str:
        return f"{self.base}:act:{activation_id}"

    @property
    def activations(self) -> str:
        """Sorted set: activation id -> creation time (s), the index that caps how many records are kept."""
        return f"{self.base}:acts"

    def activation_done(self, activation_id: str) -> str:
        """List pushed once when the activation ends, so any worker's waiter can block on it."""
        return f"{self.base}:act:{activation_id}:done"
