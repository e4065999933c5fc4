"""The training job driver (SPEC §5): rounds of actor batches, learner tasks invoked on demand through the gateway
up to the learner capacity, the parameter function invoked as gradients land, CSV outputs, checkpoints.

Event-driven: batches are awaited with XREADGROUP BLOCK, learner completions as futures; nothing polls.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import msgpack
import redis

from cache import BatchMeta, JobCache, JobLimits, LearnerTask, acl
from cache.acl import JOB_ENV
from cache.connection import REDIS_PASSWORD_ENV, REDIS_USER_ENV
from cache.lifetime import die_with_parent
from gateway.client import GatewayClient, GatewayError
from gateway.models import ACTOR_PRICING, LEARNER_PRICING, Activation, FunctionSpec, Pricing
from stellaris.config import TrainConfig
from stellaris.control.outputs import RunDir, stats
from stellaris.control.platform import Platform

BATCH_WAIT_S = 300.0
ACTOR_CHECK_S = 1.0  # while waiting for batches, how often dead serverful actors are looked for
PREWARM_WAIT_S = 120.0
REDIS_WATCH_S = 1.0  # how often the control plane pings Redis, so that it sees a restart (and re-grants) at once
MAX_RESTARTS = 64  # replacements of failed invocations (or dead actors) per round before the job gives up


class TrainingError(RuntimeError):
    pass


Call = tuple[dict[str, Any], Activation, float]  # result, metering, client-observed latency in seconds


@dataclass
class RoundStats:
    learner_results: list[dict[str, Any]] = field(default_factory=list)
    activations: list[Activation] = field(default_factory=list)
    max_in_flight: int = 0
    learner_wait_s: float = 0.0
    learner_restarts: int = 0
    parameter_restarts: int = 0
    actor_restarts: int = 0
    redis_round_trips: int = 0  # every function's and the control plane's, end to end
    # Latency breakdown (paper Fig. 14), seconds summed over the round's calls: algorithm time inside learner and
    # parameter handlers, the rest of their handler time (cache I/O, (de)serialisation), and invocation overhead
    # (client-observed latency minus handler time: HTTP, gateway queueing, instance dispatch).
    learner_compute_s: float = 0.0
    parameter_compute_s: float = 0.0
    cache_s: float = 0.0
    invocation_s: float = 0.0

    def add(self, call: Call, *, kind: str) -> None:
        result, act, latency = call
        self.activations.append(act)
        handler = act.duration_s or 0.0
        self.invocation_s += max(0.0, latency - handler)
        self.redis_round_trips += int(result.get("redis_round_trips", 0))
        if kind == "actor":
            return
        # Time blocked waiting for work (a learner for tasks others hold, the parameter function for gradients)
        # is neither computation nor platform overhead.
        wait = min(float(result.get("wait_s", 0.0)), handler)
        compute = min(float(result.get("compute_s", 0.0)), handler - wait)
        self.cache_s += handler - wait - compute
        if kind == "learner":
            self.learner_compute_s += compute
            self.learner_wait_s += wait
        else:
            self.parameter_compute_s += compute


class _RoundCalls:
    """One round's invocations: `learners` learner invocations working through the round's tasks and one parameter
    invocation applying gradients as they land. An invocation whose instance died is replaced (the replacement
    takes over the dead one's task once its lease runs out; a parameter replacement resumes from the cache)."""

    def __init__(self, trainer: Trainer, rs: RoundStats) -> None:
        self.t, self.rs = trainer, rs
        self.learners: set[Future[Call]] = set()
        self.parameter: Future[Call] | None = None

    def start(self) -> None:
        for _ in range(self.t.cfg.learners):
            self._learner()
        self._parameter()
        self.rs.max_in_flight = max(self.rs.max_in_flight, len(self.learners))

    def _learner(self) -> None:
        self.learners.add(self.t.pool.submit(self.t._call, "learner", {"job": self.t.job_id, "round": self.t.round}))

    def _parameter(self) -> None:
        event = {"job": self.t.job_id, "round": self.t.round}
        self.parameter = self.t.pool.submit(self.t._call, "parameter", event)

    def _failed(self, fut: Future[Call]) -> bool:
        """True when the call failed because its instance died or timed out (replace it); raises otherwise."""
        exc = fut.exception()
        if exc is None:
            return fut.result()[0].get("status") not in ("done", "ok")
        if isinstance(exc, GatewayError) and exc.status_code in (502, 504):
            return True
        raise exc

    def _reap(self) -> None:
        for fut in [f for f in self.learners if f.done()]:
            self.learners.discard(fut)
            if self._failed(fut):
                self.rs.learner_restarts += 1
                self._learner()
            else:
                self.rs.add(fut.result(), kind="learner")
                self.rs.learner_results.append(fut.result()[0])
        if self.parameter is not None and self.parameter.done():
            fut, self.parameter = self.parameter, None
            if self._failed(fut):
                self.rs.parameter_restarts += 1
                self._parameter()
            else:
                self.rs.add(fut.result(), kind="parameter")
        if self.rs.learner_restarts + self.rs.parameter_restarts > MAX_RESTARTS:
            raise TrainingError(f"more than {MAX_RESTARTS} function invocations failed in round {self.t.round}")

    def supervise(self, *, until_drained: bool) -> None:
        """Until every invocation has finished (the round is accounted for: each task applied or dead-lettered),
        or with `until_drained` until nothing is outstanding or queued (a sync step's update is out)."""
        job = self.t.job
        while True:
            self._reap()
            if until_drained:
                if job.board.outstanding() == 0 and job.gradients.length() == 0:
                    return
                job.policies.wait_for_version(job.policies.version() or 0, timeout_s=ACTOR_CHECK_S)
                continue
            calls = self.learners | ({self.parameter} if self.parameter else set())
            if not calls:
                return
            wait(calls, return_when=FIRST_COMPLETED)


class Trainer:
    def __init__(self, cfg: TrainConfig, platform: Platform, run: RunDir, *, state: dict[str, Any] | None) -> None:
        assert platform.cache is not None and platform.gateway is not None
        self.cfg = cfg
        self.run = run
        self.gateway: GatewayClient = platform.gateway
        self.cache = platform.cache
        self.state = state or {}
        # A resumed run is a new epoch of its job, in a namespace of its own: nothing the dead run left (tasks,
        # gradients, pending batches, leases, instances still working on them) can reach it.
        self.job_base = self.state.get("job_base") or self.state.get("job") or f"j{uuid.uuid4().hex[:10]}"
        self.epoch = int(self.state.get("epoch", -1)) + 1 if self.state else 0
        self.job_id = self.job_base if self.epoch == 0 else f"{self.job_base}-e{self.epoch}"
        self.job = JobCache(self.cache.client, self.job_id, JobLimits(trajectory_maxlen=self._queue_bound()))
        self.round = int(self.state.get("round", 0))
        self.env_steps = int(self.state.get("env_steps", 0))
        self.elapsed_before = float(self.state.get("elapsed_s", 0.0))
        self.started = time.monotonic()
        self.actor_procs: list[subprocess.Popen[bytes]] = []
        self.actors_charged_until = time.monotonic()
        self.serverful_charged_until = time.monotonic()
        self.cost_learner = float(self.state.get("cost_learner", self.state.get("cost", 0.0)))
        self.cost_actor = float(self.state.get("cost_actor", 0.0))
        self.pool = ThreadPoolExecutor(max_workers=max(cfg.learners, cfg.actors) + 1, thread_name_prefix="call")
        self.collect_estimate_s = 0.0
        self.last_policy: bytes | None = None  # the newest checkpointed weights, written as safetensors at the end
        self.spec: dict[str, Any] = {}
        self.dead_letters_after = "0-0"
        # Each actor's reward-scaler moments from its newest batch: checkpointed, and given back to actors on resume.
        self.reward_scalers: dict[str, list[float]] = dict(self.state.get("reward_scalers") or {})
        self.finished = False
        self.job_url: str | None = None  # Redis as the job's own user, when Redis has ACLs
        self.regrant: Callable[[Any], None] = lambda conn: None
        self.closed = threading.Event()
        self.watch_client = self.cache.new_client()
        self.names = {role: f"{self.job_id}-{role}" for role in ("actor", "learner", "parameter")}

    def _queue_bound(self) -> int:
        return max(2, self.cfg.actors * self.cfg.actor_run_ahead)

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        env = {
            "OMP_NUM_THREADS": str(self.cfg.torch_threads),
            "STELLARIS_LOG_LEVEL": os.environ.get("STELLARIS_LOG_LEVEL", "WARNING"),
            "STELLARIS_JOB_TRAJECTORY_MAXLEN": str(self._queue_bound()),
        }
        env |= self._job_credentials()
        self._register(
            FunctionSpec(
                name=self.names["parameter"], target="functions.handlers.parameter:handle", timeout_s=3600,
                max_concurrency=1, max_instances=1, queue_max=4, min_warm=1, env=env, pricing=LEARNER_PRICING,
            )
        )  # fmt: skip
        self._restore()
        result, act, _ = self._call("parameter", {"job": self.job_id, "init": self.cfg.job_request(self.job_id)})
        self._charge([act])
        self.spec = result["spec"]
        self.run.write_config(self.cfg.model_dump(mode="json"), self.spec)
        # A round's gradients may all wait in the queue (the staleness rule can defer them to the round's flush),
        # so the gradient and task streams are sized for whole rounds, not the generic defaults.
        per_round = int(self.spec["algo"]["num_epochs"]) * int(self.spec["algo"]["num_minibatches"])
        env |= {
            "STELLARIS_JOB_GRADIENT_MAXLEN": str(max(256, 2 * per_round)),
            "STELLARIS_JOB_TASK_MAXLEN": str(max(4096, 2 * per_round)),
        }
        self._register(self._pool_spec("learner", self.cfg.learners, env, LEARNER_PRICING))
        # Learners warm before round 1, so that round is like the others (δ_max is calibrated in it).
        self.gateway.prewarm(self.names["learner"], self.cfg.learners, wait_s=PREWARM_WAIT_S)
        if self.cfg.actor_kind == "serverless":
            self._register(self._pool_spec("actor", self.cfg.actors, env, ACTOR_PRICING))
        else:
            self._start_actors()

    def _pool_spec(self, role: str, size: int, env: dict[str, str], pricing: Pricing) -> FunctionSpec:
        """Up to `size` single-call instances of a handler: the capacity the control plane fills on demand."""
        return FunctionSpec(
            name=self.names[role], target=f"functions.handlers.{role}:handle", timeout_s=3600,
            max_concurrency=size, max_instances=size, queue_max=size, env=env, pricing=pricing,
        )  # fmt: skip

    def _register(self, spec: FunctionSpec) -> None:
        try:
            self.gateway.register(spec)
        except GatewayError as exc:
            if exc.status_code != 409:
                raise
            self.gateway.register(spec, replace=True)

    def _restore(self) -> None:
        """On resume, put the checkpoint into this epoch's fresh namespace: the policy at its version, optimizer state,
        and the parameter function's round / δ_max; the dead epoch's functions and keys go."""
        if not self.state:
            return
        self._discard_dead_epoch()
        policy, optim = self.run.checkpoint_files(self.state)
        self.job.policies.initialise(policy, optim, version=int(self.state["version"]))
        aggregator = self.state.get("aggregator") or {}
        if aggregator and not self.job.client.exists(self.job.keys.aggregator):
            self.job.client.hset(self.job.keys.aggregator, mapping=aggregator)
        if self.reward_scalers:
            scalers = {actor: json.dumps(m) for actor, m in self.reward_scalers.items()}
            self.job.client.hset(self.job.keys.actor_scalers, mapping=scalers)
            self.job.client.pexpire(self.job.keys.actor_scalers, int(self.job.limits.ttl_s * 1000))

    def _job_credentials(self) -> dict[str, str]:
        """The job's own Redis user (cache/acl.py) for its functions and actors, bound to this job: they can reach
        no other job's keys and serve no other job's events. None where Redis has no ACLs."""
        if not acl.supported(self.cache.client):
            return {}
        user, password = acl.grant_job(self.cache.client, self.job_id)
        self.regrant = acl.regrant_on_connect(self.job_id, password)
        self.cache.on_connect(self.regrant)
        # While the control plane only waits on invocations it sends nothing, so a restarted Redis would see no new
        # connection of the job's owner (and no re-grant) before the functions' retry window runs out.
        threading.Thread(target=self._watch_redis, name="redis-watch", daemon=True).start()
        self.job_url = acl.url_as(self.cache.url, user, password)
        return {REDIS_USER_ENV: user, REDIS_PASSWORD_ENV: password, JOB_ENV: self.job_id}

    def _watch_redis(self) -> None:
        while not self.closed.wait(REDIS_WATCH_S):
            with contextlib.suppress(redis.RedisError):
                self.watch_client.ping()

    def _discard_dead_epoch(self) -> None:
        """Best effort: the previous epoch's functions and keys go (a shared deployment keeps nothing of a dead run;
        whatever of it still runs writes only to its own namespace)."""
        dead = str(self.state.get("job"))
        if dead == self.job_id:
            return
        for role in ("actor", "learner", "parameter"):
            with contextlib.suppress(GatewayError):
                self.gateway.delete(f"{dead}-{role}")
        with contextlib.suppress(redis.RedisError, ValueError):
            JobCache(self.cache.client, dead).delete()
        with contextlib.suppress(redis.RedisError, ValueError):
            acl.revoke_job(self.cache.client, dead)

    def _start_actors(self) -> None:
        self.actor_procs = [self._actor_proc(i) for i in range(self.cfg.actors)]
        self.actors_charged_until = time.monotonic()

    def _actor_proc(self, index: int) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "REDIS_URL": self.job_url or self.cache.url,
            JOB_ENV: self.job_id,
            "OMP_NUM_THREADS": "1",
            "STELLARIS_JOB_TRAJECTORY_MAXLEN": str(self._queue_bound()),
        }
        cmd = [sys.executable, "-m", "functions.actor_loop", self.job_id, f"actor-{index}", str(index)]
        return subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)

    def _restart_dead_actors(self) -> int:
        """Serverful actors that died are started again (same index, so the same seed stream)."""
        restarted = 0
        for i, proc in enumerate(self.actor_procs):
            if proc.poll() is not None:
                self.actor_procs[i] = self._actor_proc(i)
                restarted += 1
        return restarted

    # -- the loop ---------------------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def done(self) -> bool:
        c = self.cfg
        return (
            (c.rounds is not None and self.round >= c.rounds)
            or (c.total_steps is not None and self.env_steps >= c.total_steps)
            or (c.max_minutes is not None and self.elapsed_s() >= c.max_minutes * 60)
        )

    def step(self) -> dict[str, Any]:
        """One round: collect a train batch, let learner invocations work through its tasks while the parameter
        function applies their gradients as they land, and record. Returns the info row."""
        self.round += 1
        t0 = time.monotonic()
        trips0 = self.cache.round_trips
        rs = RoundStats()
        # Learner instances warm by the time this round's batch is in, from the measured collection time.
        self.gateway.prewarm(self.names["learner"], self.cfg.learners, by_s=self.collect_estimate_s)
        batches, actor_time = self._collect(rs)
        self.collect_estimate_s = 0.5 * self.collect_estimate_s + 0.5 * actor_time
        ids = [bid for bid, _ in batches]
        algo = self.spec["algo"]
        m, epochs = algo["num_minibatches"], algo["num_epochs"]
        tasks = [LearnerTask(self.round, tuple(ids), e, i, m) for e in range(epochs) for i in range(m)]
        # A synchronous step is one task per learner, all on the same version, averaged into one update; the
        # next step's tasks are enqueued once that version is out (SPEC §5's `sync` baseline). Otherwise the
        # whole round is enqueued at once.
        step = self.cfg.learners if self.cfg.mode == "sync" else len(tasks)
        chunks = [tasks[lo : lo + step] for lo in range(0, len(tasks), step)]
        calls = _RoundCalls(self, rs)
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            self.job.board.enqueue(
                chunk, close_round=self.round if last else None, timeout_s=self.job.limits.backpressure_timeout_s
            )
            if i == 0:
                calls.start()
            calls.supervise(until_drained=not last)
        self.job.trajectories.ack(ids)
        rs.redis_round_trips += self.cache.round_trips - trips0  # the control plane's own
        return self._record(batches, rs, time.monotonic() - t0, actor_time)

    def _collect(self, rs: RoundStats) -> tuple[list[tuple[str, BatchMeta]], float]:
        """Batch headers until the round's env steps are in (the control plane never decodes arrays). Dead
        serverful actors are restarted, failed serverless actor calls invoked again."""
        need = int(self.spec["algo"]["train_batch_size"])
        t0 = time.monotonic()
        if self.cfg.actor_kind == "serverless":
            for i in range(self.cfg.actors):
                event = {"job": self.job_id, "actor_id": f"actor-{i}", "actor_index": i}
                rs.add(self._with_retries("actor", event, rs), kind="actor")
        batches: list[tuple[str, BatchMeta]] = []
        steps = 0
        deadline = time.monotonic() + BATCH_WAIT_S
        while steps < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TrainingError(f"no trajectory batch arrived within {BATCH_WAIT_S:.0f} s: are the actors alive?")
            got = self.job.trajectories.take("control", count=1, block_s=min(remaining, ACTOR_CHECK_S))
            batches += got
            self.reward_scalers |= {b.actor_id: b.info["reward_scaler"] for _, b in got if "reward_scaler" in b.info}
            steps += sum(b.env_steps for _, b in got)
            rs.redis_round_trips += sum(int(b.info.get("redis_round_trips", 0)) for _, b in got)
            if not got:
                rs.actor_restarts += self._restart_dead_actors()
        self.env_steps += steps
        return batches, time.monotonic() - t0

    def _call(self, role: str, event: dict[str, Any]) -> Call:
        t0 = time.perf_counter()
        result, act = self.gateway.invoke_metered(self.names[role], event)
        return result, act, time.perf_counter() - t0

    def _with_retries(self, role: str, event: dict[str, Any], rs: RoundStats) -> Call:
        """A call whose instance died (502/504) is made again, up to MAX_RESTARTS times."""
        for _ in range(MAX_RESTARTS):
            try:
                return self._call(role, event)
            except GatewayError as exc:
                if exc.status_code not in (502, 504):
                    raise
                rs.actor_restarts += 1
        raise TrainingError(f"{role} invocations failed {MAX_RESTARTS} times in a row")

    # -- accounting -------------------------------------------------------------------------------------------
    def _charge(self, acts: list[Activation]) -> None:
        """Record the activations; under serverless billing charge each its metered cost (SPEC §7)."""
        self.run.record_invocations(acts)
        if self.cfg.billing == "serverful":
            return  # held resources are charged by the wall clock instead, in _charge_held
        actor = self.names["actor"]
        self.cost_actor += sum(a.cost_usd for a in acts if a.function == actor)
        self.cost_learner += sum(a.cost_usd for a in acts if a.function != actor)

    def _charge_held(self) -> None:
        """Serverful resources are charged for the whole wall-clock time they are held (SPEC §7): serverful actors
        always (one core each); under serverful billing also every actor and the learner capacity plus the parameter
        server, at the same per-resource-second prices the meter uses."""
        now = time.monotonic()
        if self.actor_procs or self.cfg.billing == "serverful":
            self.cost_actor += (now - self.actors_charged_until) * self.cfg.actors * ACTOR_PRICING.usd_per_second
        self.actors_charged_until = now
        if self.cfg.billing == "serverful":
            slots = self.cfg.learners + 1
            self.cost_learner += (now - self.serverful_charged_until) * slots * LEARNER_PRICING.usd_per_second
        self.serverful_charged_until = now

    @property
    def cost(self) -> float:
        return self.cost_learner + self.cost_actor

    def _applied(self) -> list[dict[str, Any]]:
        """The aggregations logged since the last call (the applied log is then trimmed; gradients.csv keeps them)."""
        log = self.job.keys.applied
        items = self.job.client.xrange(log, min="-", max="+")
        out = []
        for raw_id, f in items:
            grads = msgpack.unpackb(f[b"gradients"])
            threshold = f.get(b"threshold", b"").decode()
            out.append(
                {
                    "id": raw_id,
                    "version": int(f[b"version"]),
                    "decision": f[b"decision"].decode(),
                    "threshold": float(threshold) if threshold else None,
                    "gradients": grads,  # [gradient id, task id, round, base version, staleness]
                }
            )
        if items:
            self.job.client.xdel(log, *[e["id"] for e in out])
        return out

    def _dead_letters(self) -> int:
        """Dead letters added since the last call."""
        items = self.job.board.read_dead_letters(self.dead_letters_after)
        if items:
            self.dead_letters_after = items[-1][0]
        return len(items)

    def _record(
        self, batches: list[tuple[str, BatchMeta]], rs: RoundStats, duration: float, actor_time: float
    ) -> dict[str, Any]:
        returns = [float(r) for _, b in batches for r in b.info.get("episode_returns", [])]
        now = self.elapsed_s()
        self.run.timeline.write([{"wall_clock_s": round(now, 3), "episodic_reward": r} for r in returns])
        applied = self._applied()
        self.run.gradients.write(
            [
                {
                    "gradient_id": g[0],
                    "task_id": g[1],
                    "round": g[2],
                    "base_version": g[3],
                    "applied_version": a["version"],
                }
                for a in applied
                for g in a["gradients"]
            ]
        )
        deltas = [float(g[4]) for a in applied for g in a["gradients"]]
        thresholds = [a["threshold"] for a in applied if a["threshold"] is not None]
        self._charge(rs.activations)
        self._charge_held()
        r_max, r_mean, r_min, r_std = stats(returns)
        s_max, s_mean, s_min, s_std = stats(deltas)
        results = rs.learner_results
        n_grads = sum(int(r.get("gradients", 0)) for r in results)
        n_trunc = sum(int(r.get("truncated_n", 0)) for r in results)
        learner_time = sum(a.duration_s or 0.0 for a in rs.activations if a.function == self.names["learner"])
        parameter_time = sum(a.duration_s or 0.0 for a in rs.activations if a.function == self.names["parameter"])
        row = {
            "round_id": self.round,
            "duration": round(duration, 4),
            "num_actors": self.cfg.actors,
            "envs_per_actor": self.cfg.envs_per_actor,
            "episodes": len(returns),
            "learner_time": round(learner_time, 4),
            "actor_time": round(actor_time, 4),
            "eval_reward_max": r_max,
            "eval_reward_mean": r_mean,
            "eval_reward_min": r_min,
            "eval_reward_std": r_std,
            "staleness_max": s_max,
            "staleness_mean": s_mean,
            "staleness_min": s_min,
            "staleness_std": s_std,
            "learner_loss": sum(r.get("loss_sum", 0.0) for r in results) / n_grads if n_grads else math.nan,
            "cost": self.cost,
            "staleness_bound": thresholds[-1] if thresholds else math.nan,
            "env_steps": self.env_steps,
            "truncated_fraction": sum(r.get("truncated_sum", 0.0) for r in results) / n_trunc if n_trunc else math.nan,
            "aggregations": len(applied),
            "flushes": sum(1 for a in applied if a["decision"] == "flush"),
            "parameter_time": round(parameter_time, 4),
            "learner_compute_time": round(rs.learner_compute_s, 4),
            "parameter_compute_time": round(rs.parameter_compute_s, 4),
            "cache_time": round(rs.cache_s, 4),
            "invocation_overhead": round(rs.invocation_s, 4),
            "cost_learner": self.cost_learner,
            "cost_actor": self.cost_actor,
            "learner_wait_time": round(rs.learner_wait_s, 4),
            "dead_lettered": self._dead_letters(),
            "gradients_applied": len(deltas),
            "redis_round_trips": rs.redis_round_trips,
            "learner_restarts": rs.learner_restarts,
            "parameter_restarts": rs.parameter_restarts,
            "actor_restarts": rs.actor_restarts,
        }
        self.run.info.write([row])
        self._checkpoint()
        row["max_in_flight"] = rs.max_in_flight
        return row

    def _checkpoint(self) -> None:
        version, policy = self.job.policies.latest()
        aggregator = {k.decode(): v.decode() for k, v in self.job.client.hgetall(self.job.keys.aggregator).items()}
        state = {
            "job": self.job_id,
            "job_base": self.job_base,
            "epoch": self.epoch,
            "round": self.round,
            "version": version,
            "env_steps": self.env_steps,
            "cost": self.cost,
            "cost_learner": self.cost_learner,
            "cost_actor": self.cost_actor,
            "elapsed_s": self.elapsed_s(),
            "aggregator": aggregator,
            "reward_scalers": self.reward_scalers,
        }
        self.run.checkpoint(state, policy, self.job.policies.optimizer_state())
        self.last_policy = policy

    # -- teardown ---------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """After the last round: the job's functions and cache data go (the run directory has the checkpoint), so a
        shared deployment keeps no idle instances or keys of finished jobs."""
        self._stop_actors()
        self.finished = True
        for name in self.names.values():
            try:
                self.gateway.delete(name)
            except GatewayError as exc:
                if exc.status_code != 404:
                    raise
        self.job.delete()
        if self.job_url is not None:
            self.cache.on_connect(self.regrant, remove=True)
            acl.revoke_job(self.cache.client, self.job_id)

    def _stop_actors(self) -> None:
        for proc in self.actor_procs:
            proc.terminate()
        for proc in self.actor_procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.actor_procs.clear()

    def close(self) -> None:
        self.closed.set()
        self.watch_client.close()
        self._stop_actors()
        if not self.finished and self.round > 0:
            # Stopped mid-round: end the round's invocations, or their calls would outlive the control plane (a
            # learner waits for tasks that never come) and exiting would wait on them.
            with contextlib.suppress(redis.RedisError):
                self.job.stop_round(self.round)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.last_policy is not None:
            self.run.write_final_policy(self.last_policy)
