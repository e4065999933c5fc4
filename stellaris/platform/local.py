"""The platform a job runs on: the given Redis and gateway, or an embedded Redis and a local gateway process (whose
docker functions, with `backend="docker"`, share the host's network to reach that Redis)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING

import httpx

from cache import Cache, CacheSettings
from gateway.client import GatewayClient, Recovered
from gateway.settings import HangSettings
from host.lifetime import dies_with_us, stop_process
from stellaris.platform.env_limits import count_from_env, seconds_from_env
from stellaris.platform.gateway_watch import GatewayWatch

if TYPE_CHECKING:
    from gateway.backends.ray.cluster import LocalRayCluster


class PlatformError(RuntimeError):
    pass


GATEWAY_EXIT_S = 2.0  # how long a gateway that dropped a request is given to show that it exited
GATEWAY_PROBE_S = 10.0  # how long a given gateway has to answer its first health check
GATEWAY_RECOVER_S = 120.0  # default: how long a job waits for a given gateway that went away or answers nothing
GATEWAY_RECOVER_ENV = "STELLARIS_GIVEN_GATEWAY_WAIT_S"
MAX_GATEWAY_RECOVER_S = 86_400.0
# Starts of the local gateway in a row that may be ended by a signal (a kill as it starts, say) before the job gives up.
GATEWAY_START_ATTEMPTS_ENV = "STELLARIS_GATEWAY_START_ATTEMPTS"
GATEWAY_START_ATTEMPTS = 3
DOCKER_NETWORK_ENV = "STELLARIS_DOCKER_NETWORK"  # the docker backend's network (gateway/backends/docker/backend.py)
LOCAL_RAY_CPUS_PER_CORE = 4  # logical CPUs a private local Ray declares per core (a function asks for 1)


def given_gateway_wait_s() -> float:
    """$STELLARIS_GIVEN_GATEWAY_WAIT_S, default GATEWAY_RECOVER_S; `stellaris train` checks it before it starts."""
    return seconds_from_env(GATEWAY_RECOVER_ENV, GATEWAY_RECOVER_S, 1.0, MAX_GATEWAY_RECOVER_S)


def gateway_start_attempts() -> int:
    """$STELLARIS_GATEWAY_START_ATTEMPTS (1-100), default GATEWAY_START_ATTEMPTS."""
    return count_from_env(GATEWAY_START_ATTEMPTS_ENV, GATEWAY_START_ATTEMPTS, 1, 100)


class Platform:
    """Context manager: `cache` and `gateway` (a client) are ready inside; everything started is stopped on exit,
    Ctrl-C included (the gateway drains its instances; the embedded redis-server goes last).

    A gateway that goes away mid-job is brought back: the local one is started again (same token and namespace, so
    it finds the job's functions in its Redis registry and re-creates their instances); a given one is waited for,
    up to `given_gateway_wait_s()`, whether it went away or answers nothing (its watch then ends the job)."""

    def __init__(
        self,
        *,
        redis_url: str | None,
        gateway_url: str | None,
        gateway_token: str | None,
        backend: str = "process",
        ray_address: str | None = None,
        instance_env: dict[str, str] | None = None,
    ) -> None:
        self.redis_url = redis_url
        # The load-time env the job's functions will ask for (thread counts): a gateway of ours starts its fork
        # server with it, ready before the first instance.
        self.instance_env = instance_env or {}
        self.backend = backend
        self.ray_address = ray_address
        self.ray: LocalRayCluster | None = None  # the private local Ray of a ray job given no cluster
        self.gateway_url = gateway_url
        self.gateway_token = gateway_token
        self.gateway_proc: subprocess.Popen[str] | None = None
        self.cache: Cache | None = None
        self.closing = False
        self.gateway: GatewayClient | None = None
        self.namespace = f"local-{secrets.token_hex(4)}"
        self.gateway_restarts = 0
        self.recover_s = given_gateway_wait_s()
        self.start_attempts = gateway_start_attempts()
        self.watch = GatewayWatch(
            lambda: (self.gateway_proc, self.gateway_url),
            HangSettings(),
            owned=gateway_url is None,
            give_up_s=self.recover_s,
        )

    def __enter__(self) -> Platform:
        try:
            self.cache = Cache(CacheSettings(url=self.redis_url or os.environ.get("REDIS_URL") or None))
            if self.gateway_url is None:
                if self.backend == "ray" and self.ray_address is None:
                    self._start_private_ray()
                self._start_gateway()
            else:
                self._check_given_gateway()
            self.watch.start()
            assert self.gateway_url is not None
            self.gateway = GatewayClient(
                self.gateway_url, token=self.gateway_token, timeout_s=3600, on_unreachable=self.recover_gateway
            )
        except BaseException as exc:
            # The embedded Redis killed as the job starts (the gateway then cannot reach it, and says only that):
            # a cache loss, which the run starts again from (stellaris/run.py).
            died = self.cache.server_death() if self.cache is not None else None
            self.close()
            if died is not None and not isinstance(exc, KeyboardInterrupt):
                raise died from exc
            raise
        return self

    def _check_given_gateway(self) -> None:
        """A given gateway must answer before the job starts: a wrong URL is then one line naming it, not a wait of
        its recovery wait for a gateway that was never there."""
        assert self.gateway_url is not None
        try:
            with httpx.Client(base_url=self.gateway_url, timeout=GATEWAY_PROBE_S) as probe:
                status = probe.get("/healthz").status_code
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise PlatformError(f"cannot reach the gateway at {self.gateway_url}: {exc}") from exc
        if status != 200:
            raise PlatformError(f"the gateway at {self.gateway_url} answered /healthz with {status}: not a gateway?")

    def _start_gateway(self) -> None:
        assert self.cache is not None
        self.gateway_token = self.gateway_token or secrets.token_hex(16)
        env = {
            **os.environ,
            # Process instances run on this machine: the embedded server's socket file; containers and Ray nodes
            # reach it over TCP.
            "REDIS_URL": self.cache.local_url if self.backend == "process" else self.cache.url,
            "STELLARIS_GATEWAY_PORT": "0",
            "STELLARIS_GATEWAY_TOKEN": self.gateway_token,
            "STELLARIS_GATEWAY_NAMESPACE": self.namespace,
            "STELLARIS_LOG_LEVEL": os.environ.get("STELLARIS_LOG_LEVEL", "WARNING"),
        }
        if self.backend == "process":
            env["STELLARIS_GATEWAY_FORK_SERVER_ENV"] = json.dumps(self.instance_env)
        if self.ray_address is not None:
            env["STELLARIS_GATEWAY_RAY_ADDRESS"] = self.ray_address
        if self.backend == "docker":
            # The job's containers reach this machine's Redis (an embedded one listens on loopback only) on the
            # host's network, unless the environment names another network for them.
            env.setdefault(DOCKER_NETWORK_ENV, "host")
        for attempt in range(1, self.start_attempts + 1):
            proc, line = self._spawn_gateway(env)
            if line.startswith("READY "):
                break
            code = proc.wait()
            # An exit of its own (a bad setting, a port in use) says why on stderr and would say it again; a signal
            # (a kill as it started) is a fault like a kill after it started.
            if code >= 0 or attempt == self.start_attempts:
                of = f" (start {attempt} of ${GATEWAY_START_ATTEMPTS_ENV}={self.start_attempts})" if code < 0 else ""
                raise PlatformError(f"the local gateway did not start (exit code {code}){of}")
            print(
                f"the local gateway was ended by signal {-code} as it started; starting it again",
                file=sys.stderr,
                flush=True,
            )
        # Published together once it is ready: the watch (gateway_watch.py) must not probe a starting gateway, nor
        # the new process at its predecessor's URL (it took that silence for a hang and killed it as it started).
        self.gateway_proc, self.gateway_url = proc, f"http://127.0.0.1:{int(line.split()[1])}"

    @staticmethod
    def _spawn_gateway(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
        """A gateway process and the first line it printed ("" when it ended first)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE, text=True, preexec_fn=dies_with_us()
        )
        assert proc.stdout is not None
        try:
            return proc, proc.stdout.readline()
        except BaseException:
            proc.kill()
            raise

    def _start_private_ray(self) -> None:
        """A one-node Ray of this machine, owned like the embedded Redis: it outlives a gateway restart (the new
        gateway finds the job's actors) and stops with the job. Its CPUs are logical: as on the process backend, a
        job's functions may outnumber the cores."""
        from gateway.backends.ray.cluster import LocalRayCluster  # Ray only where it is used

        self.ray = LocalRayCluster()
        self.ray.start_head(num_cpus=LOCAL_RAY_CPUS_PER_CORE * (os.cpu_count() or 1))
        self.ray_address = self.ray.address

    @property
    def instances_die_with_gateway(self) -> bool:
        """Whether the job's function instances die with its gateway: the local gateway's process instances are its
        fork server's children (containers and Ray actors outlive it, and a new gateway adopts them)."""
        return self.gateway_proc is not None and self.backend == "process"

    def recover_gateway(self) -> Recovered:
        """Bring the gateway back after a request could not reach it; says where it is (the GatewayClient's hook)."""
        assert self.gateway_url is not None
        if self.closing:  # calls still in flight when the run ends must not start a gateway again
            raise PlatformError(f"the gateway at {self.gateway_url} is stopping with the run")
        if self.gateway_proc is not None:
            try:  # a killed process refuses connections a moment before it can be reaped
                self.gateway_proc.wait(timeout=GATEWAY_EXIT_S)
            except subprocess.TimeoutExpired:
                return Recovered(self.gateway_url, self.gateway_restarts)  # still running: a dropped connection
            print(
                f"the local gateway exited with code {self.gateway_proc.returncode}; starting it again",
                file=sys.stderr,
                flush=True,
            )
            self.gateway_restarts += 1
            self._start_gateway()
            return Recovered(self.gateway_url, self.gateway_restarts)
        deadline = time.monotonic() + self.recover_s
        with httpx.Client(base_url=self.gateway_url, timeout=5) as probe:
            while time.monotonic() < deadline:
                try:
                    if probe.get("/healthz").status_code == 200:
                        return Recovered(self.gateway_url, 0)
                except httpx.TransportError:
                    pass
                time.sleep(1.0)  # a remote gateway restarting: nothing to wait on but time
        raise PlatformError(f"the gateway at {self.gateway_url} did not come back within {self.recover_s:g} s")

    def close(self) -> None:
        self.closing = True
        self.watch.stop()
        if self.gateway is not None:
            self.gateway.close()
        if self.gateway_proc is not None:
            # With the embedded Redis dead, its instances (which die with it) have nothing left to drain or finish.
            died = self.cache is not None and self.cache.server_died()
            stop_process(self.gateway_proc, 0 if died else 60)
        if self.ray is not None:
            self.ray.stop()
        if self.cache is not None:
            self.cache.close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
