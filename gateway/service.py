"""Everything a running gateway holds (registry, warm pools, backends, activations, metrics) and the operations the
routes call; created in the app's lifespan. Routes stay thin: the logic lives here, in the pools and the backends."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from cache import Cache, CacheSettings
from cache.keys import GatewayKeys
from gateway import late_starts
from gateway.activations import ActivationStore
from gateway.backends import registry
from gateway.backends.base import Backend
from gateway.backends.process.backend import ProcessBackend
from gateway.discovery import Survivors, discover, sort_survivors
from gateway.invocation import InvocationFailed, Outcome
from gateway.limits import check_registration
from gateway.metering import Metrics, charge
from gateway.models import Activation, FunctionSpec, Status
from gateway.pool import FunctionPool
from gateway.redis_client import gateway_redis
from gateway.registry import Registry
from gateway.settings import GatewaySettings

log = logging.getLogger("stellaris.gateway")


class Gateway:
    def __init__(self, settings: GatewaySettings, backends: dict[str, Backend] | None = None) -> None:
        self.settings = settings
        self.keys = GatewayKeys(settings.namespace)
        self.metrics = Metrics()
        self.pools: dict[str, FunctionPool] = {}
        self.spec_seen: dict[str, float] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._backends = backends or {}
        self.cache: Cache | None = None

    async def start(self) -> None:
        self.cache = Cache(CacheSettings(url=self.settings.redis_url) if self.settings.redis_url else None)
        # Bounded: a request waits for a free connection (up to redis_wait_s) rather than fail; a cluster URL gives a
        # cluster client (gateway/redis_client.py).
        self.redis = gateway_redis(
            self.cache, max_connections=self.settings.redis_max_connections, wait_s=self.settings.redis_wait_s
        )
        self.registry = Registry(self.redis, self.keys)
        self.activations = ActivationStore(
            self.redis, self.keys, ttl_s=self.settings.activation_ttl_s, max_records=self.settings.activation_max
        )
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None))
        if "process" not in self._backends:  # built now (not at its first function), so that its fork server can start
            process = self._backends["process"] = registry.build("process", self.settings, self.cache.url)
            if isinstance(process, ProcessBackend) and self.settings.fork_server_env is not None:
                process.start_soon(self.settings.fork_server_env)  # ready for the first instance
        for spec in await self.registry.all():
            self._new_pool(spec)
        await self.adopt_survivors()
        for pool in list(self.pools.values()):
            self.spawn(pool.ensure_min_warm())
        if self.settings.idle_probe_s > 0:
            self.spawn(self._sweep_idle(self.settings.idle_probe_s))
        if self.settings.hung_after_s > 0:
            self.spawn(self._watch_busy(self.settings.busy_probe_s, self.settings.hung_after_s))

    async def _sweep_idle(self, every_s: float) -> None:
        """Idle instances that died are found and replaced between calls (gateway/liveness.py), and the pools of
        functions no longer registered are closed."""
        while True:
            await asyncio.sleep(every_s)
            await self._drop_unregistered()
            for pool in list(self.pools.values()):
                try:
                    await pool.probe_idle()
                except Exception:  # a backend's probe failing must not end the sweep; the next round tries again
                    log.exception("probing the idle instances of %r failed", pool.spec.name)

    async def _watch_busy(self, every_s: float, hung_after_s: float) -> None:
        """Instances under a call that stopped answering are killed, so that their calls end (gateway/hung.py)."""
        while True:
            started, pools = time.monotonic(), list(self.pools.values())
            probes = (pool.probe_busy(timeout_s=every_s, hung_after_s=hung_after_s) for pool in pools)
            for pool, probed in zip(pools, await asyncio.gather(*probes, return_exceptions=True), strict=True):
                if isinstance(probed, Exception):  # as in the idle sweep: the next round tries again
                    log.error("probing the busy instances of %r failed", pool.spec.name, exc_info=probed)
            await asyncio.sleep(max(0.0, every_s - (time.monotonic() - started)))

    async def _drop_unregistered(self) -> None:
        """A function deleted through another worker, or lost with the cache's data, gets no call here that would
        find it gone: without this its pool, min_warm instances included, would live as long as the gateway."""
        try:
            registered = await self.registry.names()
            for name in [n for n in self.pools if n not in registered]:
                if await self.registry.get(name) is None:  # not registered again since the look
                    log.info("function %r is no longer registered: its instances stop", name)
                    await self.drop(name)
        except RedisError as exc:  # Redis away: the next sweep looks again
            log.debug("could not compare the pools with the registry: %s", exc)

    async def adopt_survivors(self) -> Survivors:
        """Each instance that outlived the last gateway run goes to its own function's pool (gateway/discovery.py),
        on the backends that registered functions use; the ones no pool takes are stopped in the background."""
        used = {pool.backend.name for pool in self.pools.values()}
        backends = {name: b for name, b in self._backends.items() if name in used}
        found = await discover(backends)
        if not found:
            return Survivors()
        registered = {spec.name for spec in await self.registry.all()}  # read after discovery: see sort_survivors
        survivors = sort_survivors(found, self.pools, registered)
        for handle in survivors.stopped:
            backend = self._backends[handle.backend]
            self.spawn(asyncio.to_thread(backend.stop, handle, timeout_s=self.settings.stop_timeout_s))
        return survivors

    async def stop(self) -> None:
        try:
            await self.activations.drain()
        except (RedisError, OSError) as exc:
            # Redis is gone (e.g. the job's embedded server died): the records in flight are lost, and shutting down
            # says so in one line rather than failing with a traceback.
            log.warning("gateway stopping without writing its last activation records: %s", exc)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        # Process instances never outlive the gateway, nor do the actors of a private Ray (drained here, before their
        # cluster stops); containers and a given Ray cluster's actors stay up to be found again.
        ephemeral = {"process", *(["ray"] if self.settings.ray_address is None else [])}
        await asyncio.gather(*(p.close(stop_instances=p.backend.name in ephemeral) for p in self.pools.values()))
        await self._settle_late_starts()
        for name in ("process", "ray"):
            backend = self._backends.get(name)
            if backend is not None and hasattr(backend, "close"):
                await asyncio.to_thread(backend.close)
        await self.http.close()
        await self.redis.aclose()
        if self.cache is not None:
            self.cache.close()

    async def _settle_late_starts(self) -> None:
        """Before the event loop ends: an instance whose start is still in its thread then is never stopped."""
        if (running := late_starts.in_flight()) == 0:
            return
        wait_s = self.settings.late_start_wait_s
        log.warning("gateway stopping: waiting up to %.0f s for %d instance start(s) or stop(s)", wait_s, running)
        if left := await late_starts.settle(wait_s):
            log.warning("gateway stopping with %d instance start(s) or stop(s) still running: left behind", left)

    def backend(self, name: str) -> Backend:
        """The backend `name`, built at its first use (gateway/backends/registry.py: the docker SDK and Ray are
        imported only where a function runs on them); a name the registry lacks is a 422 naming it."""
        if name not in self._backends:
            try:
                self._backends[name] = registry.build(name, self.settings, self.cache.url if self.cache else None)
            except registry.UnknownBackend as exc:
                raise HTTPException(422, str(exc)) from exc
        return self._backends[name]

    # -- the registry -----------------------------------------------------------------------------------------
    def resolve(self, spec: FunctionSpec) -> FunctionSpec:
        """`spec` checked against this gateway's limits, with its backend named: a registration that names none
        runs on the gateway's default backend (STELLARIS_GATEWAY_BACKEND). Raises a 422."""
        check_registration(spec, self.settings)
        if spec.backend is not None:
            return spec
        try:
            return FunctionSpec.model_validate({**spec.model_dump(), "backend": self.settings.backend})
        except ValidationError as exc:
            problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise HTTPException(
                422, f"{problems} (the gateway's default backend; name one in 'backend' to choose another)"
            ) from exc

    async def create(self, spec: FunctionSpec) -> tuple[FunctionSpec, int]:
        """Register a new function and start its min_warm instances: (the stored spec, how many started)."""
        spec = self.resolve(spec)
        if not await self.registry.put(spec, create=True):
            raise HTTPException(409, f"function {spec.name!r} exists; use PUT to update it")
        return spec, await self._new_pool(spec).ensure_min_warm()

    async def replace(self, spec: FunctionSpec) -> tuple[FunctionSpec, int]:
        """Update a registered function; its old pool drains in the background."""
        spec = self.resolve(spec)
        if not await self.registry.exists(spec.name):  # (one stored unreadable may be replaced)
            raise HTTPException(404, f"no function named {spec.name!r}")
        await self.registry.put(spec, create=False)
        old = self.pools.pop(spec.name, None)
        if old is not None:
            self.spawn(old.close())
        return spec, await self._new_pool(spec).ensure_min_warm()

    async def delete(self, name: str) -> None:
        if not await self.registry.delete(name):
            raise HTTPException(404, f"no function named {name!r}")
        await self.drop(name)

    def _new_pool(self, spec: FunctionSpec) -> FunctionPool:
        backend = self.backend(spec.backend or self.settings.backend)
        pool = FunctionPool(spec, backend, self.http, self.metrics, stop_timeout_s=self.settings.stop_timeout_s)
        self.pools[spec.name] = pool
        self.spec_seen[spec.name] = time.monotonic()
        return pool

    async def pool(self, name: str) -> FunctionPool:
        """This worker's pool for `name`, refreshed from the shared registry when it may be stale."""
        pool = self.pools.get(name)
        if pool is not None and time.monotonic() - self.spec_seen[name] < self.settings.spec_refresh_s:
            return pool
        spec = await self.registry.get(name)
        if spec is None:
            if pool is not None:
                self.spawn(self.drop(name))
            raise HTTPException(404, f"no function named {name!r}")
        if pool is not None and pool.spec == spec:
            self.spec_seen[name] = time.monotonic()
            return pool
        if pool is not None:
            self.spawn(pool.close())
        return self._new_pool(spec)

    async def drop(self, name: str) -> None:
        pool = self.pools.pop(name, None)
        self.spec_seen.pop(name, None)
        if pool is not None:
            await pool.close()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- invocation -------------------------------------------------------------------------------------------
    async def run(
        self,
        pool: FunctionPool,
        act: Activation,
        event: dict[str, Any],
        *,
        admitted: bool = False,
        affinity: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Invoke and complete the activation record; returns (HTTP status, body)."""
        name = pool.spec.name
        outcome: Outcome | None = None
        try:
            outcome = await pool.invoke(event, call_id=act.id, admitted=admitted, affinity=affinity)
            code, body = 200, outcome.result or {}
            act.status, act.result = Status.SUCCESS, outcome.result
        except InvocationFailed as failed:
            outcome = failed.outcome
            code, body = failed.status_code, {"error": failed.error}
            act.status, act.error = failed.status, failed.error
        act.end, act.status_code = time.time(), code
        if outcome is not None:
            act.instance, act.cold, act.init_s, act.node = outcome.instance, outcome.cold, outcome.init_s, outcome.node
            if outcome.container_id is not None:
                act.container_id, act.image = outcome.container_id, pool.spec.image
            act.wait_s, act.duration_s, act.found_dead = outcome.wait_s, outcome.duration_s, outcome.found_dead
            act.resource_seconds, act.cost_usd = charge(outcome.duration_s, pool.spec.pricing)
            self.metrics.wait_seconds.labels(name).observe(outcome.wait_s)
            self.metrics.duration_seconds.labels(name).observe(outcome.duration_s)
            self.metrics.cost_usd.labels(name).inc(act.cost_usd)
        self.metrics.invocations.labels(name, str(code)).inc()
        return code, body
