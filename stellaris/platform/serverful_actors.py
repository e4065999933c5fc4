"""A job's serverful actors: the control plane's own processes (`python -m functions.actor.loop`), one per actor,
started, restarted when dead, scaled and stopped here. They are forked from a fork server of their own that has the
actor loop imported (gateway/backends/process/zygote.py), so a restart or a scale-up takes a fork, not a fresh
interpreter's imports; where that server cannot start, each starts as a fresh interpreter."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable

from cache import JobCache
from contract.instance_env import inherited_env
from contract.zygote import SpawnRequest
from gateway.backends.process.zygote import ForkedProcess, ForkServer, ForkServerError
from gateway.settings import HangSettings
from host.lifetime import dies_with_us
from stellaris.platform.actor_watch import ActorWatch
from stellaris.platform.calls import TrainingError
from stellaris.platform.env_limits import count_from_env

ACTOR_MODULE = "functions.actor.loop"
# A serverful actor is restarted at most this many times in a row with no batch of its landing in between; its next
# death ends the job: it crashes on start (a broken env, a missing module), and restarting it again would only burn
# a core. From the environment.
ACTOR_RESTARTS_ENV = "STELLARIS_ACTOR_MAX_RESTARTS"
ACTOR_RESTARTS_DEFAULT = 5
# Read when torch loads, so the actors' fork server is started with it (every actor computes on one core).
ACTOR_THREADS_ENV = {"OMP_NUM_THREADS": "1"}
# "0": every actor starts as a fresh interpreter (no fork server). From the environment.
ACTOR_FORK_ENV = "STELLARIS_ACTOR_FORK_SERVER"
STARTUP_TIMEOUT_S = 120.0
log = logging.getLogger("stellaris")

ActorProcess = subprocess.Popen[bytes] | ForkedProcess


def max_actor_restarts() -> int:
    try:
        return count_from_env(ACTOR_RESTARTS_ENV, ACTOR_RESTARTS_DEFAULT, 1, 1000)
    except ValueError as exc:
        raise TrainingError(str(exc)) from exc


def fork_from_env() -> bool:
    raw = os.environ.get(ACTOR_FORK_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise TrainingError(f"{ACTOR_FORK_ENV} must be 1 (actors forked from a fork server, the default) or 0: {raw!r}")
    return raw != "0"


class ServerfulActors:
    """The job's actor processes. `env(index)` is actor `index`'s own environment (the cache's address, the job,
    its stream bound, the device): asked at each start, so a restart gets the job's credentials as they are now."""

    def __init__(
        self,
        job_id: str,
        run_ahead: int,
        env: Callable[[], dict[str, str]],
        *,
        fork: bool | None = None,
        job: JobCache | None = None,
    ) -> None:
        """`job`: where the actors' heartbeats are read (none: hung actors are not looked for)."""
        self.job_id, self.run_ahead, self.env, self.job = job_id, run_ahead, env, job
        self.watch = ActorWatch(HangSettings().hung_after_s if job is not None else 0.0)
        self.procs: list[ActorProcess] = []
        self.deaths: dict[str, int] = {}  # by actor id: deaths since its last landed batch
        self.max_restarts = max_actor_restarts()
        self.stopping: list[ActorProcess] = []  # scaled-down actors finishing the batch in hand
        # Like a function instance, an actor inherits only the allowed part of our environment (never the gateway's
        # token or the deployment's Redis password) and gets the job's own Redis user from `env`.
        base = {**inherited_env(os.environ), **ACTOR_THREADS_ENV}
        fork = fork_from_env() if fork is None else fork
        self.forks = ForkServer(sys.executable, None, base, STARTUP_TIMEOUT_S, (ACTOR_MODULE,)) if fork else None

    def start_soon(self) -> None:
        """Start the actors' fork server in the background, ready when the first actor starts."""
        if self.forks is not None:
            self.forks.start_soon()

    def _start(self, index: int) -> ActorProcess:
        if self.job is not None:  # what an earlier process of this actor beat says nothing of this one
            self.watch.forget(f"actor-{index}")
            self.job.client.hdel(self.job.keys.actor_beats, f"actor-{index}")
        env = {**inherited_env(os.environ), **ACTOR_THREADS_ENV, **self.env()}
        argv = [self.job_id, f"actor-{index}", str(index), str(self.run_ahead)]
        cmd = [sys.executable, "-m", ACTOR_MODULE, *argv]
        if self.forks is not None and not self.forks.failed:
            request = SpawnRequest(
                module=ACTOR_MODULE, argv=argv, env=env, cwd=None, memory_bytes=None, title=" ".join(cmd)
            )
            try:
                return self.forks.spawn(request, stdout=1)  # our stdout, which a child we started would inherit
            except ForkServerError as exc:
                log.warning("starting actor-%d without its fork server: %s", index, exc)
        return subprocess.Popen(cmd, env=env, preexec_fn=dies_with_us())

    def start(self, count: int) -> None:
        self.procs = [self._start(i) for i in range(count)]

    def restart_dead(self) -> int:
        """Actors that died are started again (same index, so the same seed stream); one that died more than
        `max_restarts` times in a row without landing a batch ends the job (TrainingError)."""
        restarted = 0
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                self.deaths[f"actor-{i}"] = deaths = self.deaths.get(f"actor-{i}", 0) + 1
                if deaths > self.max_restarts:
                    raise TrainingError(
                        f"actor-{i} died {deaths} times in a row without landing a batch (last exit code "
                        f"{proc.returncode}; its error is above); {ACTOR_RESTARTS_ENV}={self.max_restarts}"
                    )
                self.procs[i] = self._start(i)
                restarted += 1
        return restarted

    def kill_hung(self) -> list[str]:
        """Actors whose heartbeat stood still for `hung_after_s` of looking (stellaris/platform/actor_watch.py) are
        killed, for `restart_dead` to start them again; returns their ids. Called while batches are waited for."""
        if self.job is None or self.watch.hung_after_s <= 0 or not self.procs:
            return []
        raw = self.job.client.hgetall(self.job.keys.actor_beats)
        now = time.monotonic()
        killed = []
        for actor in self.watch.hung({k.decode(): int(v) for k, v in raw.items()}, now):
            index = int(actor.removeprefix("actor-"))
            if index < len(self.procs) and self.procs[index].poll() is None:
                print(
                    f"{actor} gave no heartbeat for {self.watch.silent_s(actor, now):.1f} s: killing it, to start "
                    "it again",
                    file=sys.stderr,
                    flush=True,
                )
                self.procs[index].kill()
                self.procs[index].wait(timeout=30)
                killed.append(actor)
        return killed

    def landed(self, actor_ids: set[str]) -> None:
        """Batches of these actors landed: their runs of deaths are over."""
        for actor_id in actor_ids:
            self.deaths.pop(actor_id, None)

    def scale(self, count: int) -> tuple[int, int]:
        """Up or down to `count`; returns (started, stopped). Extra ones start with the next actor ids; surplus ones
        (the newest) get SIGTERM, which an actor obeys between batches, so the batch in hand still lands and is
        consumed like any other."""
        self.stopping = [proc for proc in self.stopping if proc.poll() is None]
        started = max(0, count - len(self.procs))
        self.procs += [self._start(len(self.procs)) for _ in range(started)]
        surplus = self.procs[count:]
        del self.procs[count:]
        for proc in surplus:
            proc.terminate()
        self.stopping += surplus
        return started, len(surplus)

    def stop(self, *, at_once: bool = False) -> None:
        """Stop every actor (SIGTERM, then SIGKILL after 30 s; `at_once`: SIGKILL), then the fork server."""
        self.procs += self.stopping
        self.stopping = []
        for proc in self.procs:
            proc.kill() if at_once else proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def close(self) -> None:
        self.stop()
        if self.forks is not None:
            self.forks.close()
