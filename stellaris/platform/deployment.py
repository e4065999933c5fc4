"""A job's functions on the gateway: their specs and registration, pre-warming, invocation (`GatewayFunctions`, the
round protocol's way of calling them), the job's own Redis user, serverful actor processes, and removal."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from cache import Cache, CacheError, JobCache, acl
from cache.acl import JOB_ENV
from cache.connection import REDIS_PASSWORD_ENV, REDIS_USER_ENV, credentials_env
from contract.runtime_http import DEVICE_ENV
from gateway.client import GatewayClient, GatewayError
from gateway.models import ACTOR_PRICING, LEARNER_PRICING, BackendName, FunctionSpec, Resources
from stellaris.config import TrainConfig
from stellaris.platform.calls import Call, Role
from stellaris.platform.serverful_actors import ServerfulActors

PREWARM_WAIT_S = 120.0
REDIS_WATCH_S = 1.0  # how often the control plane pings Redis, so that it sees a restart (and re-grants) at once
ROLES: tuple[Role, ...] = ("actor", "learner", "parameter")


@dataclass(frozen=True)
class Placement:
    """Where one role's instances run: the gateway backend, always named (whatever the gateway's default), the
    image (docker), GPUs per instance (docker: a DeviceRequest; ray: a share of one), the Ray custom resources that
    pick its nodes, and the torch device the handler uses."""

    backend: BackendName
    image: str | None
    gpus: float
    device: str
    resources: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: TrainConfig, role: Role) -> Placement:
        resources = cfg.role_resources(role)
        return cls(cfg.backend, cfg.role_image(role), cfg.role_gpus(role), cfg.role_device(role), resources)


def placements(cfg: TrainConfig) -> dict[Role, Placement]:
    return {role: Placement.of(cfg, role) for role in ROLES}


def function_spec(name: str, role: Role, place: Placement, env: dict[str, str], **limits: Any) -> FunctionSpec:
    """A role's function: its handler (a container's too: the docker backend passes the target as --handler), where
    it runs, and the device its handler computes on (in its environment, beside `env`)."""
    return FunctionSpec(
        name=name,
        target=f"functions.handlers.{role}:handle",
        backend=place.backend,
        image=place.image if place.backend == "docker" else None,
        resources=Resources(gpus=place.gpus, custom=dict(place.resources)),
        timeout_s=3600,
        env={**env, DEVICE_ENV: place.device},
        pricing=ACTOR_PRICING if role == "actor" else LEARNER_PRICING,
        **limits,
    )


def function_names(job_id: str) -> dict[Role, str]:
    return {role: f"{job_id}-{role}" for role in ROLES}


class GatewayFunctions:
    """The round protocol's functions, invoked through the gateway's HTTP API with metering. A 502 or 504 means the
    instance died or timed out: the protocol replaces the call."""

    def __init__(self, gateway: GatewayClient, names: dict[Role, str], *, die_with_gateway: bool = False) -> None:
        self.gateway, self.names = gateway, names
        self.die_with_gateway = die_with_gateway  # `Platform.instances_die_with_gateway`

    def invoke(self, role: Role, event: dict[str, Any]) -> Call:
        t0 = time.perf_counter()
        # A serverless actor's envs stay on the instance that stepped them: ask for that one again.
        affinity = str(event["actor_id"]) if role == "actor" and "actor_id" in event else None
        result, act = self.gateway.invoke_metered(self.names[role], event, affinity=affinity)
        return Call(result, time.perf_counter() - t0, act)

    def died(self, exc: BaseException) -> bool:
        return isinstance(exc, GatewayError) and exc.status_code in (502, 504)

    def gone(self, exc: BaseException) -> bool:
        # The gateway kills an instance that crashed, hung or timed out before it answers so. A gateway that died
        # under the call (502 GatewayRestarted) took its process instances along; an unreachable one (502
        # GatewayUnreachable), or one whose instances outlive it, says nothing of them: they may still be working.
        if not isinstance(exc, GatewayError):
            return False
        kind = exc.error.get("type")
        return kind in ("InstanceCrashed", "InstanceHung", "Timeout") or (
            kind == "GatewayRestarted" and self.die_with_gateway
        )


class Deployment:
    """One epoch of a job on the platform. `env` is what every instance of the job gets (threads, log level, the
    job's stream bounds and, where Redis has ACLs, the job's own credentials); `placement` says where each role's
    functions run. Serverful actors are the control plane's own processes whatever the backend."""

    def __init__(
        self,
        gateway: GatewayClient,
        cache: Cache,
        job: JobCache,
        *,
        queue_bound: int,
        actor_run_ahead: int = 1,
        placement: Mapping[Role, Placement],
        die_with_gateway: bool = False,
    ) -> None:
        self.gateway, self.cache, self.job = gateway, cache, job
        self.placement = dict(placement)
        self.job_id = job.keys.job
        self.names = function_names(self.job_id)
        self.functions = GatewayFunctions(gateway, self.names, die_with_gateway=die_with_gateway)
        self.queue_bound, self.actor_run_ahead = queue_bound, actor_run_ahead
        self.actors = ServerfulActors(self.job_id, actor_run_ahead, self._actor_env, job=job)
        self.job_url: str | None = None  # Redis as the job's own user, when Redis has ACLs
        self.regrant: Callable[[Any], None] = lambda conn: None
        self.closed = threading.Event()
        self.watch_client = cache.new_client()

    # -- functions --------------------------------------------------------------------------------------------
    def spec(self, role: Role, env: dict[str, str], **limits: Any) -> FunctionSpec:
        return function_spec(self.names[role], role, self.placement[role], env, **limits)

    def register_parameter(self, env: dict[str, str], *, spares: int = 0) -> None:
        """One call at a time (the update lease allows one holder anyway), on one warm instance plus `spares` idle
        ones: the call that replaces a killed instance's takes a spare instead of waiting for a cold start."""
        warm = 1 + spares
        self.register(self.spec("parameter", env, max_concurrency=1, max_instances=warm, queue_max=4, min_warm=warm))

    def register_pool(self, role: Role, size: int, env: dict[str, str], *, spares: int = 0) -> None:
        """Up to `size` single-call instances of a handler running at once: the capacity the control plane fills on
        demand; `spares` more may be kept warm (`prewarm`), so a replacement call finds one idle."""
        self.register(self.spec(role, env, max_concurrency=size, max_instances=size + spares, queue_max=size))

    def register(self, spec: FunctionSpec) -> None:
        try:
            self.gateway.register(spec)
        except GatewayError as exc:
            if exc.status_code != 409:
                raise
            self.gateway.register(spec, replace=True)

    def prewarm(self, role: Role, count: int, *, by_s: float | None = None, wait: bool = False) -> None:
        """`count` instances of a role's function warm by `by_s` from now, or (`wait`) before this returns."""
        self.gateway.prewarm(self.names[role], count, by_s=by_s, wait_s=PREWARM_WAIT_S if wait else 0.0)

    def delete_functions(self) -> None:
        for name in self.names.values():
            try:
                self.gateway.delete(name)
            except GatewayError as exc:
                if exc.status_code != 404:
                    raise

    # -- the job's Redis user ---------------------------------------------------------------------------------
    def job_credentials(self) -> dict[str, str]:
        """The job's own Redis user (cache/acl.py) for its functions and actors, bound to this job: they can reach
        no other job's keys and serve no other job's events. None where Redis has no ACLs."""
        if not acl.supported(self.cache.client):
            # No per-job user: the functions get the deployment's own credentials, named in their registration (the
            # gateway hands none on), and nothing keeps one job from another's keys there.
            return credentials_env(self.cache.url)
        grant = acl.grant_job(self.cache.client, self.job_id)
        self.regrant = acl.regrant_on_connect(grant)
        self.cache.on_connect(self.regrant)
        # While the control plane only waits on invocations it sends nothing, so a restarted Redis would see no new
        # connection of the job's owner (and no re-grant) before the functions' retry window runs out.
        threading.Thread(target=self._watch_redis, name="redis-watch", daemon=True).start()
        self.job_url = acl.url_as(self.cache.local_url, grant.user, grant.password)  # for actors: on this machine
        return {REDIS_USER_ENV: grant.user, REDIS_PASSWORD_ENV: grant.password, JOB_ENV: self.job_id}

    def _watch_redis(self) -> None:
        while not self.closed.wait(REDIS_WATCH_S):
            try:
                self.watch_client.ping()
            except redis.RedisError:
                pass
            except CacheError:
                return  # the embedded server died: the run's cache watch ends the run (stellaris/platform/cache_watch)

    def revoke(self) -> None:
        if self.job_url is not None:
            self.cache.on_connect(self.regrant, remove=True)
            acl.revoke_job(self.cache.client, self.job_id)

    def discard(self, dead_job_id: str) -> None:
        """Best effort: a previous epoch's functions and keys go (a shared deployment keeps nothing of a dead run;
        whatever of it still runs writes only to its own namespace)."""
        if dead_job_id == self.job_id:
            return
        for name in function_names(dead_job_id).values():
            with contextlib.suppress(GatewayError):
                self.gateway.delete(name)
        with contextlib.suppress(redis.RedisError, ValueError):
            JobCache(self.cache.client, dead_job_id).delete()
        with contextlib.suppress(redis.RedisError, ValueError):
            acl.revoke_job(self.cache.client, dead_job_id)

    # -- serverful actors -------------------------------------------------------------------------------------
    def _actor_env(self) -> dict[str, str]:
        return {
            "REDIS_URL": self.job_url or self.cache.local_url,
            JOB_ENV: self.job_id,
            "STELLARIS_JOB_TRAJECTORY_MAXLEN": str(self.queue_bound),
            DEVICE_ENV: "cpu",
        }

    def stop_actors(self) -> None:
        # With Redis gone no batch of theirs can land any more: do not wait for them to give up.
        self.actors.stop(at_once=self.cache.server_died())

    def close(self) -> None:
        self.closed.set()
        self.watch_client.close()
        self.stop_actors()
        self.actors.close()
