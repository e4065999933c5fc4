"""The training job driver (docs/algorithms.md): per round, a train batch from the actors, then the round protocol
(`rounds.Rounds`) through the gateway, then the report rows and a checkpoint. The round itself is wired in one place,
`connect_round` (stellaris/round/wiring.py); deployment, billing and report rows live in their own modules. This
one holds the job's epoch, what lies between its rounds, its checkpoints and its teardown.

Event-driven: batches are awaited with XREADGROUP BLOCK, invocations as futures; nothing polls.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import uuid
from typing import Any

import redis

from cache import BatchMeta, CacheError, JobCache, JobLimits
from contract import AggregatorState, InitResult, RoundShape
from stellaris.config import TrainConfig
from stellaris.platform.billing import Billing
from stellaris.platform.calls import Call
from stellaris.platform.deployment import Deployment, placements
from stellaris.platform.local import Platform
from stellaris.platform.secrets import without_secrets
from stellaris.round.evaluation import Evaluator
from stellaris.round.profiles import rounds_for
from stellaris.round.protocol import MAX_RESTARTS, LearnerGate, TrainingError
from stellaris.round.replay import ReplayRounds
from stellaris.round.scaling import Scaler, resumed_actors
from stellaris.round.wiring import DeadLetters, RoundParts, connect_round
from stellaris.rundir.outputs import RunDir
from stellaris.rundir.progress import Standing

__all__ = ["Trainer", "TrainingError", "threads_env"]


def threads_env(cfg: TrainConfig | None = None) -> dict[str, str]:
    """The thread count every function instance of the job starts with (read when torch loads); without a config,
    the default's."""
    threads = cfg.torch_threads if cfg is not None else TrainConfig.model_fields["torch_threads"].default
    return {"OMP_NUM_THREADS": str(threads)}


class Trainer:
    def __init__(self, cfg: TrainConfig, platform: Platform, run: RunDir, *, state: dict[str, Any] | None) -> None:
        assert platform.cache is not None and platform.gateway is not None
        self.state = state or {}
        self.cfg = cfg = resumed_actors(cfg, self.state.get("elastic") or {})
        self.run = run
        self.cache = platform.cache
        # A resumed run is a new epoch of its job, in a namespace of its own: nothing the dead run left (tasks,
        # gradients, pending batches, leases, instances still working on them) can reach it.
        self.job_base = self.state.get("job_base") or self.state.get("job") or f"j{uuid.uuid4().hex[:10]}"
        self.epoch = int(self.state.get("epoch", -1)) + 1 if self.state else 0
        self.job_id = self.job_base if self.epoch == 0 else f"{self.job_base}-e{self.epoch}"
        self.job = JobCache(self.cache.client, self.job_id, JobLimits(trajectory_maxlen=self.cfg.queue_bound))
        self.round = int(self.state.get("round", 0))
        self.env_steps = int(self.state.get("env_steps", 0))
        self.elapsed_before = float(self.state.get("elapsed_s", 0.0))
        self.started = time.monotonic()
        self.deployment = Deployment(
            platform.gateway,
            self.cache,
            self.job,
            queue_bound=self.cfg.queue_bound,
            actor_run_ahead=self.cfg.actor_run_ahead,
            placement=placements(cfg),
            die_with_gateway=platform.instances_die_with_gateway,
        )
        self.names = self.deployment.names
        self.billing = Billing(
            cfg.billing,
            actors=cfg.actors,
            learners=cfg.learners,
            actor_function=self.names["actor"],
            state=self.state,
            spares=2 * cfg.standby,  # a learner and a parameter-function instance each
        )
        self.rounds = rounds_for(cfg)(
            self.job, self.deployment.functions, mode=cfg.mode, learners=cfg.learners, actors=cfg.actor_capacity
        )
        self.evaluator = Evaluator(
            self.deployment.functions,
            self.job_id,
            every=cfg.eval_every,
            episodes=cfg.eval_episodes,
            seed=cfg.seed,
            max_episode_steps=cfg.eval_max_episode_steps,
        )
        self.collect_estimate_s = 0.0
        self.last_policy: bytes | None = None  # the newest checkpointed weights, written as safetensors at the end
        self.shape: RoundShape | None = None  # from the job's resolved spec, once the parameter function made it
        self.parts: RoundParts | None = None  # the round's producers and consumers, once setup() made them
        # Each actor's reward-scaler moments from its newest batch: checkpointed, and given back to actors on resume.
        self.reward_scalers: dict[str, list[float]] = dict(self.state.get("reward_scalers") or {})
        self.carried: list[tuple[str, BatchMeta]] = []  # landed beyond a round's choice: the next round's first
        self.finished = False
        # Elastic actors and the learner schedule (docs/workflows.md).
        self.scaler = Scaler(
            cfg,
            self.state.get("elastic"),
            rounds=self.rounds,
            billing=self.billing,
            crew=self.deployment.actors,
            prewarm_actors=functools.partial(self.deployment.gateway.prewarm, self.names["actor"]),
        )
        gate_state = self.state.get("learner_trigger")
        payloads = cfg.distribution == "trajectories"  # a header alone is the batch under gradients_at_actors
        self.gate = LearnerGate(cfg.triggers.learner, self.job, gate_state, payloads=payloads)  # docs/workflows.md

    def _create_job(self, event: dict[str, Any]) -> Call:
        """The parameter function's `init` call, made again (it is idempotent) when its instance died under it, as a
        round's calls are: a kill as the job (or a resumed epoch) starts is a fault like any other."""
        functions = self.deployment.functions
        for _ in range(MAX_RESTARTS - 1):
            try:
                return functions.invoke("parameter", event)
            except Exception as exc:
                if not functions.died(exc):
                    raise
        return functions.invoke("parameter", event)

    @property
    def cost(self) -> float:
        return self.billing.cost

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self.cfg.actor_kind == "serverful":
            self.deployment.actors.start_soon()  # its imports overlap the job's creation
        env = {
            **threads_env(self.cfg),
            "STELLARIS_LOG_LEVEL": os.environ.get("STELLARIS_LOG_LEVEL", "WARNING"),
            "STELLARIS_JOB_TRAJECTORY_MAXLEN": str(self.cfg.queue_bound),
        }
        env |= self.deployment.job_credentials()
        self.deployment.register_parameter(env, spares=self.cfg.standby)
        self._restore()
        init = self._create_job({"job": self.job_id, "init": self.cfg.job_request(self.job_id).model_dump(mode="json")})
        self._charge([init.metered] if init.metered else [])
        spec = InitResult.from_dict(init.result).spec
        self.shape = RoundShape.of_spec(spec)
        self.replay = ReplayRounds(self.job, spec, seed=self.cfg.seed, out_dir=self.run.path)  # cache/replay
        self.replay.restore(self.state.get("replay"), round_k=self.round)  # on resume: what the dead run's held
        self.run.write_config(without_secrets(self.cfg.model_dump(mode="json")), spec)  # no password, no token
        # A round's gradients may all wait in the queue (the staleness rule can defer them to the round's flush),
        # so the gradient and task streams are sized for whole rounds, not the generic defaults.
        per_round = self.shape.num_epochs * self.shape.num_minibatches
        env |= {
            "STELLARIS_JOB_GRADIENT_MAXLEN": str(max(256, 2 * per_round)),
            "STELLARIS_JOB_TASK_MAXLEN": str(max(4096, 2 * per_round)),
        }
        self.deployment.register_pool("learner", self.cfg.learner_capacity, env, spares=self.cfg.standby)
        # Actors start while the learners warm: their starts overlap (each is mostly imports) and round 1's batch is
        # sampled with version 0 either way.
        if self.cfg.actor_kind == "serverless":
            self.deployment.register_pool("actor", self.cfg.actor_capacity, env)
            self.deployment.prewarm("actor", self.cfg.actors)
        else:
            self.deployment.actors.start(self.cfg.actors)
            self.billing.actors_started()
            if self.cfg.eval_every:  # evaluations are actor-function calls: one instance for them
                self.deployment.register_pool("actor", 1, env)
        # Learners warm before round 1, so that round is like the others (δ_max is calibrated in it).
        self.deployment.prewarm("learner", self.cfg.learners + self.cfg.standby, wait=True)
        self.parts = RoundParts(
            crew=self.deployment.actors,
            job=self.job,
            gate=self.gate,
            replay=self.replay,
            shape=self.shape,
            rounds=self.rounds,
            run=self.run,
            evaluator=self.evaluator,
            billing=self.billing,
            dead_letters=DeadLetters(self.job),
            scaler=self.scaler,
            names=self.names,
            prewarm_learners=lambda n, by_s: self.deployment.prewarm("learner", n, by_s=by_s),
            round_trips=lambda: self.cache.round_trips,
            clock=self.elapsed_s,
        )

    def _restore(self) -> None:
        """On resume, put the checkpoint into this epoch's fresh namespace: the policy at its version, optimizer state,
        and the parameter function's aggregator state (round, δ_max, ...); the dead epoch's functions and keys go."""
        if not self.state:
            return
        self.deployment.discard(str(self.state.get("job")))
        policy, optim = self.run.checkpoint_files(self.state)
        self.job.policies.initialise(policy, optim, version=int(self.state["version"]))
        saved = self.state.get("aggregator") or {}
        if saved:
            self.job.aggregator.restore(AggregatorState.from_fields(saved))
        if self.reward_scalers:
            scalers = {actor: json.dumps(m) for actor, m in self.reward_scalers.items()}
            self.job.client.hset(self.job.keys.actor_scalers, mapping=scalers)
            self.job.client.pexpire(self.job.keys.actor_scalers, int(self.job.limits.ttl_s * 1000))

    # -- the loop ---------------------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def standing(self) -> Standing:
        """Where the run stands against its budgets."""
        return Standing.of(self.cfg, elapsed_s=self.elapsed_s(), round_k=self.round, env_steps=self.env_steps)

    def done(self) -> bool:
        return self.standing().spent() is not None

    def step(self) -> dict[str, Any]:
        """One round (`connect_round`: collect a train batch, let learner invocations work through its tasks while
        the parameter function applies their gradients as they land, and record), then its checkpoint. Returns the
        info row."""
        assert self.parts is not None, "setup() first"
        self.round += 1
        played = connect_round(
            self.parts,
            self.round,
            self.cfg,
            env_steps=self.env_steps,
            carried=self.carried,
            warm_by_s=self.collect_estimate_s,
        )
        self.cfg, self.env_steps, self.carried = played.cfg, played.env_steps, played.carried
        self.reward_scalers |= played.reward_scalers
        self.collect_estimate_s = 0.5 * self.collect_estimate_s + 0.5 * played.collect_s
        self._checkpoint()
        return played.row

    # -- accounting -------------------------------------------------------------------------------------------
    def _charge(self, acts: list[Any]) -> None:
        """Record the activations; under serverless billing charge each its metered cost (docs/experiments.md)."""
        self.run.record_invocations(acts)
        self.billing.charge(acts)

    def _checkpoint(self) -> None:
        version, policy = self.job.policies.latest()
        state = {
            "job": self.job_id,
            "job_base": self.job_base,
            "epoch": self.epoch,
            "round": self.round,
            "version": version,
            "env_steps": self.env_steps,
            **self.billing.state(),
            "elapsed_s": self.elapsed_s(),
            "aggregator": self.job.aggregator.get().to_fields(),
            "reward_scalers": self.reward_scalers,
            "elastic": self.scaler.state(self.cfg.actors),
            "learner_trigger": self.gate.state(),
            "replay": self.replay.checkpoint(),  # writes the batches no earlier checkpoint wrote
        }
        self.run.checkpoint(state, policy, self.job.policies.optimizer_state())
        self.replay.checkpointed()  # then the files of batches the new state.json no longer holds go
        self.last_policy = policy

    # -- teardown ---------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """After the last round: the job's functions and cache data go (the run directory has the checkpoint), so a
        shared deployment keeps no idle instances or keys of finished jobs."""
        self.deployment.stop_actors()
        self.finished = True
        self.deployment.delete_functions()
        self.job.delete()
        self.deployment.revoke()

    def close(self) -> None:
        self.deployment.close()
        if not self.finished and self.round > 0:
            # Stopped mid-round: end the round's invocations, or their calls would outlive the control plane (a
            # learner waits for tasks that never come) and exiting would wait on them.
            with contextlib.suppress(redis.RedisError, CacheError):
                self.job.stop_round(self.round)
        self.rounds.close()
        if self.last_policy is not None:
            self.run.write_final_policy(self.last_policy)
