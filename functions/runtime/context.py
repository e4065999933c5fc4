"""What a handler sees besides its event: the cache, its call id, a logger, and warm per-instance state."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cache import Cache, JobCache
from cache import connect as connect_cache
from contract.packed import PACKED

if TYPE_CHECKING:
    import gymnasium as gym
    import torch

    from contract.jobspec import JobSpec
    from functions.actor.state import ActorState
    from functions.algos.gap_aware import ParameterGaps
    from functions.model.policies import ActorCritic


@dataclass(frozen=True)
class PreparedRound:
    """A round's data as the learner's algorithm prepared it (``Algorithm.prepare``), with the batch arrays it came
    from (for the observation moments), kept for the round's other tasks on this instance."""

    batch_ids: tuple[str, ...]
    batches: Sequence[Any]
    data: Any


@dataclass
class WarmModel:
    """The parameter function's policy and optimizer as it last published them (`version`)."""

    version: int
    policy: ActorCritic
    optimizer: torch.optim.Optimizer
    named: list[tuple[str, torch.nn.Parameter]] = field(init=False)  # what the optimizer steps, by gradient name
    gaps: ParameterGaps | None = None  # the published parameters a distance penalty reads (`functions.algos.gap_aware`)

    def __post_init__(self) -> None:
        from functions.model.flat_params import flat_params

        fp = flat_params(self.policy)
        # A packed policy's optimizer steps its one flat tensor, fed by packed gradients (`FlatParams.pack`).
        self.named = [(PACKED, fp.flat)] if fp is not None else list(self.policy.named_parameters())


@dataclass
class WarmState:
    """What a warm instance keeps between invocations, by what it is keyed on. A missing entry is rebuilt from the
    cache, so a cold start costs time only, except that an actor's envs then start new episodes."""

    specs: dict[str, JobSpec] = field(default_factory=dict)  # by job
    spaces: dict[str, tuple[gym.Space, gym.Space]] = field(default_factory=dict)  # by env id
    policies: dict[str, OrderedDict[int, ActorCritic]] = field(default_factory=dict)  # by job: an LRU by version
    rounds: dict[str, PreparedRound] = field(default_factory=dict)  # by job: the newest round's learner data
    models: dict[tuple[str, str], WarmModel] = field(default_factory=dict)  # by (job, optimizer name)
    actors: dict[tuple[str, str], ActorState] = field(default_factory=dict)  # by (job, actor id)


class Instance:
    """Lives as long as the warm instance: one cache connection and the warm state (`memo`) for reuse across
    invocations, and how many invocations it has served.

    The cache connects on first use (`connect`, by default `$REDIS_URL` else an embedded server), so a handler that
    never touches it never starts a redis-server. Handlers may run on several threads, hence the lock.
    """

    def __init__(
        self,
        cache: Cache | None = None,
        memo: WarmState | None = None,
        jobs: dict[str, JobCache] | None = None,
        *,
        connect: Callable[[], Cache] = connect_cache,
    ) -> None:
        self._cache = cache
        self._connect = connect
        self._lock = threading.Lock()
        self.memo = WarmState() if memo is None else memo
        self.invocations = 0
        self.jobs: dict[str, JobCache] = {} if jobs is None else jobs
        self._device: torch.device | None = None

    @property
    def device(self) -> torch.device:
        """Where this instance's learner or parameter handlers compute: `$STELLARIS_DEVICE`, read on first use
        (`functions.model.device`; a bad value raises `DeviceError` each time it is asked for). Actors never ask."""
        from functions.model.device import choose_device

        with self._lock:
            if self._device is None:
                self._device = choose_device()
            return self._device

    @property
    def cache(self) -> Cache:
        with self._lock:
            if self._cache is None:
                self._cache = self._connect()
            return self._cache

    @property
    def cache_opened(self) -> bool:
        return self._cache is not None

    def job(self, job_id: str) -> JobCache:
        cache = self.cache
        with self._lock:
            if job_id not in self.jobs:
                self.jobs[job_id] = JobCache(cache.client, job_id)
            return self.jobs[job_id]

    def count_invocation(self) -> None:
        with self._lock:
            self.invocations += 1

    def close(self) -> None:
        """Close the cache if it was opened (stops an embedded server); a later use reconnects."""
        with self._lock:
            cache, self._cache = self._cache, None
            self.jobs.clear()
        if cache is not None:
            cache.close()


@dataclass
class Context:
    """Per invocation (each one counted in its instance's `invocations`)."""

    call_id: str
    instance: Instance
    log: logging.LoggerAdapter = field(init=False)

    def __post_init__(self) -> None:
        self.log = logging.LoggerAdapter(logging.getLogger("stellaris.function"), {"call_id": self.call_id})
        self.instance.count_invocation()

    def job(self, job_id: str) -> JobCache:
        return self.instance.job(job_id)

    @property
    def memo(self) -> WarmState:
        return self.instance.memo

    @property
    def device(self) -> torch.device:
        return self.instance.device
