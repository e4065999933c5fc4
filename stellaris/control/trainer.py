"""The training job driver (SPEC §5): rounds of actor batches, learner tasks invoked on demand through the gateway
up to the learner capacity, the parameter function invoked as gradients land, CSV outputs, checkpoints.

Event-driven: batches are awaited with XREADGROUP BLOCK, learner completions as futures; nothing polls.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from cache import JobCache, JobLimits, LearnerTask, TrajectoryBatch
from cache.lifetime import die_with_parent
from gateway.client import GatewayClient, GatewayError
from gateway.models import ACTOR_PRICING, LEARNER_PRICING, Activation, FunctionSpec, Pricing
from stellaris.config import TrainConfig
from stellaris.control.outputs import RunDir, stats
from stellaris.control.platform import Platform

BATCH_WAIT_S = 300.0


class TrainingError(RuntimeError):
    pass


Call = tuple[dict[str, Any], Activation, float]  # result, metering, client-observed latency in seconds


@dataclass
class RoundStats:
    learner_results: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    activations: list[Activation] = field(default_factory=list)
    max_in_flight: int = 0
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
        if kind == "actor":
            return
        compute = min(float(result.get("compute_s", 0.0)), handler)
        self.cache_s += handler - compute
        if kind == "learner":
            self.learner_compute_s += compute
        else:
            self.parameter_compute_s += compute


class Trainer:
    def __init__(self, cfg: TrainConfig, platform: Platform, run: RunDir, *, state: dict[str, Any] | None) -> None:
        assert platform.cache is not None and platform.gateway is not None
        self.cfg = cfg
        self.run = run
        self.gateway: GatewayClient = platform.gateway
        self.cache = platform.cache
        self.state = state or {}
        self.job_id = self.state.get("job") or f"j{uuid.uuid4().hex[:10]}"
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
        self.learners = ThreadPoolExecutor(max_workers=cfg.learners, thread_name_prefix="learner-call")
        self.collect_estimate_s = 0.0
        self.last_policy: bytes | None = None  # the newest checkpointed weights, written as safetensors at the end
        self.spec: dict[str, Any] = {}
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
        """On resume, put the checkpoint back into the cache: the policy at its version, optimizer state, and the
        parameter function's round / δ_max (a no-op where the cache still has the job)."""
        if not self.state:
            return
        policy = (self.run.path / "policy.bin").read_bytes()
        optim_path = self.run.path / "optimizer.bin"
        optim = optim_path.read_bytes() if optim_path.exists() else b""
        self.job.policies.initialise(policy, optim, version=int(self.state["version"]))
        aggregator = self.state.get("aggregator") or {}
        if aggregator and not self.job.client.exists(self.job.keys.aggregator):
            self.job.client.hset(self.job.keys.aggregator, mapping=aggregator)

    def _start_actors(self) -> None:
        env = {
            **os.environ,
            "REDIS_URL": self.cache.url,
            "OMP_NUM_THREADS": "1",
            "STELLARIS_JOB_TRAJECTORY_MAXLEN": str(self._queue_bound()),
        }
        for i in range(self.cfg.actors):
            cmd = [sys.executable, "-m", "functions.actor_loop", self.job_id, f"actor-{i}", str(i)]
            self.actor_procs.append(subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent))
        self.actors_charged_until = time.monotonic()

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
        """One round: collect a train batch, run its learner tasks, aggregate, record. Returns the info row."""
        self.round += 1
        t0 = time.monotonic()
        rs = RoundStats()
        # Learner instances warm by the time this round's batch is in, from the measured collection time.
        self.gateway.prewarm(self.names["learner"], self.cfg.learners, by_s=self.collect_estimate_s)
        batches, actor_time = self._collect(rs)
        self.collect_estimate_s = 0.5 * self.collect_estimate_s + 0.5 * actor_time
        ids = [bid for bid, _ in batches]
        algo = self.spec["algo"]
        m, epochs = algo["num_minibatches"], algo["num_epochs"]
        tasks = [LearnerTask(self.round, tuple(ids), e, i, m) for e in range(epochs) for i in range(m)]
        if self.cfg.mode == "sync":
            # A synchronous step: one task per learner, all on the same version, averaged into one update; the
            # next step's learners wait for that version (SPEC §5's `sync` baseline).
            step = self.cfg.learners
            for lo in range(0, len(tasks), step):
                chunk = tasks[lo : lo + step]
                self.job.enqueue_tasks(chunk)
                self._run_tasks(len(chunk), rs, sync_expected=len(chunk))
        else:
            self.job.enqueue_tasks(tasks)
            self._run_tasks(len(tasks), rs, sync_expected=None)
        self.job.trajectories.ack(ids)
        return self._record(batches, rs, time.monotonic() - t0, actor_time)

    def _collect(self, rs: RoundStats) -> tuple[list[tuple[str, TrajectoryBatch]], float]:
        need = int(self.spec["algo"]["train_batch_size"])
        t0 = time.monotonic()
        if self.cfg.actor_kind == "serverless":
            events = [{"job": self.job_id, "actor_id": f"actor-{i}", "actor_index": i} for i in range(self.cfg.actors)]
            calls = [self.learners.submit(self._call, "actor", event) for event in events]
            for call in calls:
                rs.add(call.result(), kind="actor")
        batches: list[tuple[str, TrajectoryBatch]] = []
        steps = 0
        deadline = time.monotonic() + BATCH_WAIT_S
        while steps < need:
            got = self.job.trajectories.take("control", count=1, block_s=max(0.0, deadline - time.monotonic()))
            if not got:
                raise TrainingError(f"no trajectory batch arrived within {BATCH_WAIT_S:.0f} s: are the actors alive?")
            batches += got
            steps += sum(b.env_steps for _, b in got)
        self.env_steps += steps
        return batches, time.monotonic() - t0

    def _call(self, role: str, event: dict[str, Any]) -> Call:
        t0 = time.perf_counter()
        result, act = self.gateway.invoke_metered(self.names[role], event)
        return result, act, time.perf_counter() - t0

    def _learner_call(self, reclaim: bool) -> Call:
        event: dict[str, Any] = {"job": self.job_id}
        if reclaim:
            event["reclaim_idle_s"] = 0.0
        return self._call("learner", event)

    def _parameter_call(self, rs: RoundStats, sync_expected: int | None) -> dict[str, Any]:
        call = self._call("parameter", {"job": self.job_id, "sync_expected": sync_expected, "wait_s": 30.0})
        rs.add(call, kind="parameter")
        rs.decisions += call[0].get("decisions", [])
        return call[0]

    def _run_tasks(self, n: int, rs: RoundStats, *, sync_expected: int | None) -> None:
        """Invoke learners on demand, one task each, at most `learners` at once; the parameter function after
        every gradient; then flush until the round's queue is empty."""
        pending: set[Future[Call]] = set()
        launched, reclaim = 0, False
        while launched < n or pending:
            while launched < n and len(pending) < self.cfg.learners:
                pending.add(self.learners.submit(self._learner_call, reclaim))
                launched += 1
                reclaim = False
            rs.max_in_flight = max(rs.max_in_flight, len(pending))
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    call = fut.result()
                except GatewayError as exc:
                    if exc.status_code not in (502, 504):
                        raise
                    launched -= 1  # its task stays pending under a dead consumer: the next call reclaims it
                    reclaim = True
                    continue
                rs.add(call, kind="learner")
                if call[0].get("status") == "done":
                    rs.learner_results.append(call[0])
            self._parameter_call(rs, sync_expected)
        for _ in range(16):  # liveness: nothing in flight now, so the rule flushes what it deferred
            out = self._parameter_call(rs, sync_expected)
            decisions = out.get("decisions", [])
            if out.get("status") == "ok" and (not decisions or not decisions[-1]["stalenesses"]):
                return
        raise TrainingError("the parameter function did not drain the round's gradients")

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

    def _record(
        self, batches: list[tuple[str, TrajectoryBatch]], rs: RoundStats, duration: float, actor_time: float
    ) -> dict[str, Any]:
        returns = [float(r) for _, b in batches for r in b.info.get("episode_returns", [])]
        now = self.elapsed_s()
        self.run.timeline.write([{"wall_clock_s": round(now, 3), "episodic_reward": r} for r in returns])
        applied = [d for d in rs.decisions if d["applied"]]
        deltas = [float(s) for d in applied for s in d["stalenesses"][: d["count"]]]
        thresholds = [d["threshold"] for d in applied if d.get("threshold") is not None]
        self._charge(rs.activations)
        self._charge_held()
        r_max, r_mean, r_min, r_std = stats(returns)
        s_max, s_mean, s_min, s_std = stats(deltas)
        losses = [r["loss"] for r in rs.learner_results if "loss" in r]
        truncated = [r["truncated_fraction"] for r in rs.learner_results if "truncated_fraction" in r]
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
            "learner_loss": sum(losses) / len(losses) if losses else math.nan,
            "cost": self.cost,
            "staleness_bound": thresholds[-1] if thresholds else math.nan,
            "env_steps": self.env_steps,
            "truncated_fraction": sum(truncated) / len(truncated) if truncated else math.nan,
            "aggregations": len(applied),
            "flushes": sum(1 for d in applied if d["decision"] == "flush"),
            "parameter_time": round(parameter_time, 4),
            "learner_compute_time": round(rs.learner_compute_s, 4),
            "parameter_compute_time": round(rs.parameter_compute_s, 4),
            "cache_time": round(rs.cache_s, 4),
            "invocation_overhead": round(rs.invocation_s, 4),
            "cost_learner": self.cost_learner,
            "cost_actor": self.cost_actor,
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
            "round": self.round,
            "version": version,
            "env_steps": self.env_steps,
            "cost": self.cost,
            "cost_learner": self.cost_learner,
            "cost_actor": self.cost_actor,
            "elapsed_s": self.elapsed_s(),
            "aggregator": aggregator,
        }
        self.run.checkpoint(state, policy, self.job.policies.optimizer_state())
        self.last_policy = policy

    # -- teardown ---------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """After the last round: the job's functions and cache data go (the run directory has the checkpoint), so a
        shared deployment keeps no idle instances or keys of finished jobs."""
        self._stop_actors()
        for name in self.names.values():
            try:
                self.gateway.delete(name)
            except GatewayError as exc:
                if exc.status_code != 404:
                    raise
        self.job.delete()

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
        self._stop_actors()
        self.learners.shutdown(wait=False, cancel_futures=True)
        if self.last_policy is not None:
            self.run.write_final_policy(self.last_policy)
