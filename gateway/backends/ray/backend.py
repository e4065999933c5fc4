"""Ray backend: each instance is a named detached Ray actor (gateway/backends/ray/host.py) running the function
runtime in its own process on the node Ray placed it on, serving HTTP on that node's address. The gateway's pool,
metering and activation records stay ours; Ray decides only where an instance runs.

- Placement: the actor asks for the spec's `cpus`, `gpus` (fractions share a GPU) and `custom` resources, so it
  lands on a node that declares them (e.g. {"gpu_node": 0.01} on the GPU nodes).
- Names: the actor is named after the instance id, in the Ray namespace "stellaris-<gateway namespace>", with
  max_restarts=0: an instance that dies (its process or its node) is replaced by our pool like any crashed one.
- Security: the runtime listens off loopback, so every call carries this backend's secret (SECRET_HEADER), which
  the runtime checks; an adopted actor reports its own.
- Cluster: `address` None starts a private LocalRayCluster head (this machine's CPUs) on first use and stops it on
  close(), its instances with it; with an address (a cluster this process runs on a node of), the actors are
  detached and outlive a gateway stop, like containers, and a restarted gateway finds them again (discover).
- The cache: a REDIS_URL on loopback is refused when a node is on another machine (ray_checks.py).

Ray's state API needs the dashboard, so `alive` pings the actor; every Ray call is bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import httpx
import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayError

from cache.acl import url_without_credentials
from contract.runtime_http import HEALTH_PATH, SECRET_ENV, SECRET_HEADER
from gateway.backends.base import LABEL_APP, LABEL_FUNCTION, LABEL_NAMESPACE, LABEL_SPEC, BackendError, InstanceHandle
from gateway.backends.ray.checks import refuse_loopback_cache, unplaced_reason
from gateway.backends.ray.cluster import LocalRayCluster, RayClusterError
from gateway.backends.ray.host import HostConfig, RemoteRuntimeHost
from gateway.models import FunctionSpec

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

log = logging.getLogger("stellaris.gateway.ray")
INSTANCE_ENV = "STELLARIS_INSTANCE_ID"
DRAIN_MARGIN_S = 5.0  # beyond the drain's own bound: the actor call's round trip


def from_settings(settings: GatewaySettings, redis_url: str | None) -> RayBackend:
    """The gateway's ray backend (gateway/backends/registry.py); it joins (or starts) its cluster only when first
    used."""
    return RayBackend(
        address=settings.ray_address,
        namespace=settings.namespace,
        redis_url=redis_url,
        startup_timeout_s=settings.ray_startup_timeout_s,
    )


class RayBackend:
    """Instances as Ray actors. `namespace`: the gateway's registry namespace. `redis_url`: every instance's
    REDIS_URL, less its credentials (a spec's own env wins). `startup_timeout_s` bounds a start (placement, serving);
    `call_timeout_s` bounds a ping or describe. `cluster_env` is added to a private cluster's nodes' environment."""

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None,
        namespace: str,
        redis_url: str | None,
        startup_timeout_s: float = 120.0,
        call_timeout_s: float = 10.0,
        extra_env: Mapping[str, str] | None = None,
        cluster_env: Mapping[str, str] | None = None,
    ) -> None:
        self.address = address
        self.ray_namespace = f"stellaris-{namespace}"
        self.namespace = namespace
        self.redis_url = redis_url
        self.startup_timeout_s = startup_timeout_s
        self.call_timeout_s = call_timeout_s
        self.extra_env = dict(extra_env or {})
        self.cluster_env = dict(cluster_env or {})
        self.secret = secrets.token_urlsafe(32)  # one per gateway backend; adopted actors keep their own
        self.cluster: LocalRayCluster | None = None
        self._actors: dict[str, ActorHandle] = {}
        self._connected = False
        self._lock = threading.Lock()

    # -- the cluster ------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Join the cluster once (a private head first when no address was given). Ray's driver state is one per
        process: a process already connected elsewhere is refused."""
        with self._lock:
            if self._connected:
                return
            if ray.is_initialized():
                raise BackendError("this process is already a Ray driver; one backend per process joins Ray")
            if self.address is not None:
                self._join(self.address)
            else:
                self.cluster = LocalRayCluster(env=self.cluster_env, start_timeout_s=self.startup_timeout_s)
                try:
                    self.cluster.start_head()
                    self._join(self.cluster.address)
                except (BackendError, RayClusterError, OSError) as exc:
                    self.cluster.stop()
                    self.cluster = None
                    raise BackendError(f"cannot start a private Ray: {exc}") from exc
            self._connected = True

    def _join(self, address: str) -> None:
        # On the main thread ray.init replaces the SIGTERM handler with sys.exit: keep the owner's (a server's
        # graceful stop). Off it (the gateway calls backends from worker threads) it leaves signals alone.
        on_main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
        # Ray's C++ failure-signal handler prints a stack dump on every SIGTERM, which is how the gateway is stopped.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        try:
            ray.init(address=address, namespace=self.ray_namespace, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise BackendError(f"cannot join the Ray cluster at {address}: {exc}") from exc
        finally:
            if on_main and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        log.info("joined Ray at %s (namespace %s)", address, self.ray_namespace)

    def node_addresses(self) -> list[str]:
        return [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]

    def close(self) -> None:
        """Leave Ray. A private cluster is stopped (its instances with it); a given cluster's actors run on."""
        with self._lock:
            if self._connected:
                ray.shutdown()
                self._connected = False
            self._actors.clear()
            if self.cluster is not None:
                self.cluster.stop()
                self.cluster = None

    # -- the Backend protocol ---------------------------------------------------------------------------------
    def start(self, spec: FunctionSpec, *, instance_id: str) -> InstanceHandle:
        if not spec.target:
            raise BackendError(f"function {spec.name!r} has no target for the ray backend")
        started = time.perf_counter()
        self.connect()
        refuse_loopback_cache(self.redis_url, self.node_addresses())
        address = {"REDIS_URL": url_without_credentials(self.redis_url)} if self.redis_url else {}  # job's user: spec
        env = {**self.extra_env, **address, **spec.env, INSTANCE_ENV: instance_id, SECRET_ENV: self.secret}
        config = HostConfig(
            instance=instance_id,
            function=spec.name,
            target=spec.target,
            spec_digest=spec.digest(),
            concurrency=spec.concurrency_per_instance,
            timeout_s=spec.timeout_s,
            ready_timeout_s=self.startup_timeout_s,
            secret=self.secret,
            env=env,
            labels={
                LABEL_APP: "stellaris",
                LABEL_FUNCTION: spec.name,
                LABEL_NAMESPACE: self.namespace,
                LABEL_SPEC: spec.digest(),
            },
        )
        asked = self.asked(spec)
        what = f"instance {instance_id} of {spec.name!r} ({spec.target})"
        try:
            actor = RemoteRuntimeHost.options(
                name=instance_id,
                namespace=self.ray_namespace,
                lifetime="detached",
                max_restarts=0,
                num_cpus=spec.resources.cpus,
                num_gpus=spec.resources.gpus,
                resources=dict(spec.resources.custom),
            ).remote(asdict(config))
        except (ValueError, RayError) as exc:
            raise BackendError(f"{what}: Ray refused the actor: {exc}") from exc
        described = actor.describe.remote()
        ready, _ = ray.wait([described], timeout=self.startup_timeout_s)
        if not ready:
            self._kill(actor)
            raise BackendError(f"{what}: {unplaced_reason(asked, ray.nodes(), self.startup_timeout_s)}")
        try:
            handle = self._handle(ray.get(described, timeout=self.call_timeout_s))
        except (RayError, GetTimeoutError) as exc:
            self._kill(actor)
            raise BackendError(f"{what} failed to start on Ray: {_last_lines(str(exc))}") from exc
        self._check_reachable(actor, handle, what, deadline=started + self.startup_timeout_s)
        with self._lock:
            self._actors[instance_id] = actor
        handle.init_s = time.perf_counter() - started
        log.info("%s serving at %s on node %s in %.2f s", what, handle.url, handle.node, handle.init_s)
        return handle

    def alive(self, handle: InstanceHandle) -> bool:
        actor = self._actor(handle.id)
        if actor is None:
            return False
        try:
            return bool(ray.get(actor.ping.remote(), timeout=self.call_timeout_s))
        except (RayError, GetTimeoutError) as exc:
            log.info("instance %s of %r does not answer: %s", handle.id, handle.function, type(exc).__name__)
            return False

    def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        """Drain (the runtime's graceful stop, bounded by timeout_s), then kill the actor. Idempotent."""
        actor = self._actor(handle.id)
        if actor is None:
            return
        try:
            ray.get(actor.drain.remote(timeout_s), timeout=timeout_s + DRAIN_MARGIN_S)
        except (RayError, GetTimeoutError) as exc:
            log.info("instance %s of %r did not drain: %s", handle.id, handle.function, type(exc).__name__)
        self._kill(actor)
        with self._lock:
            self._actors.pop(handle.id, None)

    def kill(self, handle: InstanceHandle) -> None:
        actor = self._actor(handle.id)
        if actor is not None:
            self._kill(actor)

    def discover(self) -> list[InstanceHandle]:
        """This namespace's actors that answer, as handles (each reports its function, spec, url, node and secret).
        A private cluster never outlives its gateway: nothing to find there, and no reason to start one."""
        if self.address is None:
            return []
        self.connect()
        names = [
            a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == self.ray_namespace
        ]
        asked: dict[str, tuple[ActorHandle, Any]] = {}
        for name in names:
            actor = self._actor(name)
            if actor is not None:
                asked[name] = (actor, actor.describe.remote())
        refs = [ref for _, ref in asked.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.call_timeout_s) if refs else ([], [])
        handles = []
        for name, (actor, ref) in asked.items():
            if ref not in ready:
                log.warning("ignoring Ray actor %s: it did not describe itself within %g s", name, self.call_timeout_s)
                continue
            try:
                handles.append(self._handle(ray.get(ref)))
            except RayError as exc:
                log.info("ignoring Ray actor %s: %s", name, type(exc).__name__)
                continue
            with self._lock:
                self._actors[name] = actor
        return handles

    # -- helpers ---------------------------------------------------------------------------------------------
    @staticmethod
    def asked(spec: FunctionSpec) -> dict[str, float]:
        """The Ray resources one instance asks for."""
        res = spec.resources
        return {"CPU": res.cpus, **({"GPU": res.gpus} if res.gpus else {}), **res.custom}

    def _handle(self, described: dict[str, Any]) -> InstanceHandle:
        return InstanceHandle(
            id=described["instance"],
            function=described["function"],
            url=described["url"],
            backend=self.name,
            node=described["node"],
            secret=described["secret"],
            spec_digest=described["spec_digest"],
            labels=dict(described["labels"]),
        )

    def _check_reachable(self, actor: ActorHandle, handle: InstanceHandle, what: str, *, deadline: float) -> None:
        """The runtime answers the gateway at its url (the node's address: a firewall shows here, not at the first
        call); otherwise the actor is killed."""
        headers = {SECRET_HEADER: handle.secret or ""}
        timeout_s = max(1.0, deadline - time.perf_counter())
        try:
            response = httpx.get(f"{handle.url}{HEALTH_PATH}", headers=headers, timeout=timeout_s)
            problem = None if response.status_code == 200 else f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            self._kill(actor)
            raise BackendError(f"{what} serves at {handle.url} on node {handle.node}, but the gateway gets {problem}")

    def _actor(self, name: str) -> ActorHandle | None:
        with self._lock:
            actor = self._actors.get(name)
        if actor is not None:
            return actor
        self.connect()
        try:
            return ray.get_actor(name, namespace=self.ray_namespace)
        except ValueError:  # no such actor (any more)
            return None

    @staticmethod
    def _kill(actor: ActorHandle) -> None:
        with contextlib.suppress(RayError, ValueError):
            ray.kill(actor, no_restart=True)


def _last_lines(text: str, lines: int = 12) -> str:
    return os.linesep.join(text.strip().splitlines()[-lines:])
