"""The gradients_at_actors profile through the real handlers and the control plane's round protocol
(`stellaris.round.profiles.FusedRounds`), invoked in-process on a real Redis: actors ship gradients and batch
headers only, and every gradient they ship is applied exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from cache import Cache, GradientMeta, GradientRecord, JobCache
from cache.tasks import ActorGradients
from contract.algo_config import NetworkConfig, PPOConfig
from contract.codec import HEADER_FIELD, decode_fields_meta
from contract.errors import BackpressureTimeout
from contract.jobspec import JobSpec
from functions.actor.fused import batch_minibatches, batch_tasks
from stellaris.round.profiles import FusedRounds
from stellaris.round.protocol import RoundStats
from tests.functions.driver import Driver, applied_log

EPOCHS, MINIBATCHES = 2, 4


def fused_spec(job: str, *, actors: int) -> JobSpec:
    cfg = PPOConfig(
        lr=1e-3,
        train_batch_size=256,
        num_minibatches=MINIBATCHES,
        num_epochs=EPOCHS,
        network=NetworkConfig(kind="mlp", hidden=(16, 16)),
    )
    steps = 256 // (actors * 2)
    return JobSpec(
        job=job,
        env_id="CartPole-v1",
        algo=cfg,
        num_envs=2,
        actor_steps=steps,
        seed=3,
        distribution="gradients_at_actors",
    )


def test_batch_minibatches_keep_the_learners_minibatch_size() -> None:
    # 2,048-step rounds in 32 minibatches of 64: a 1,024-step batch (2 actors) gets 16, a whole round all 32.
    assert batch_minibatches(1024, train_batch_size=2048, num_minibatches=32) == 16
    assert batch_minibatches(2048, train_batch_size=2048, num_minibatches=32) == 32
    assert batch_minibatches(100, train_batch_size=4096, num_minibatches=4) == 1  # at least one
    with pytest.raises(ValueError, match="env_steps"):
        batch_minibatches(0, train_batch_size=2048, num_minibatches=32)
    tasks = batch_tasks(3, "b", epochs=2, minibatches=2)
    assert [(t.round, t.epoch, t.minibatch, t.num_minibatches) for t in tasks] == [
        (3, 0, 0, 2),
        (3, 0, 1, 2),
        (3, 1, 0, 2),
        (3, 1, 1, 2),
    ]


def test_fused_rounds_ship_headers_only_and_apply_every_gradient_once(cache_conn: Cache, job_id: str) -> None:
    actors, rounds = 2, 3
    driver = Driver(cache_conn, fused_spec(job_id, actors=actors), actors=actors)
    job = driver.job
    protocol = FusedRounds(job, driver.functions, mode="stellaris", learners=2, actors=actors, enqueue_timeout_s=5.0)
    headers: list[str] = []
    try:
        for k in range(1, rounds + 1):
            rs = RoundStats()
            protocol.begin(k, rs)
            results = protocol.invoke_actors(actors, rs)
            taken = job.trajectories.take("control", count=actors, block_s=5.0)
            assert sorted(i for i, _ in taken) == sorted(r.batch_id for r in results)
            assert all(meta.info["gradients"] == EPOCHS * MINIBATCHES // actors for _, meta in taken)
            # Every entry on the trajectory stream is a header: no array field, no array in the header.
            for _, fields in job.client.xrange(job.keys.traj):
                assert set(fields) == {HEADER_FIELD}
                assert decode_fields_meta(fields)["kind"] == "trajectory"
            headers += [i for i, _ in taken]
            protocol.learn(k, [], rs)
            assert rs.learner_results == [] and len(rs.parameter_results) == 1  # no learner was invoked
            job.trajectories.ack([i for i, _ in taken])
    finally:
        protocol.close()
    assert job.gradients.length() == 0  # all applied
    applied = [g for row in applied_log(job) for g in row["gradients"]]
    gradient_ids = [g[0] for g in applied]
    task_ids = [g[1] for g in applied]
    # Each actor's batch (half a round) gets half the round's minibatches: the round's count of gradients.
    assert len(applied) == rounds * EPOCHS * MINIBATCHES
    assert len(set(gradient_ids)) == len(gradient_ids) and len(set(task_ids)) == len(task_ids)
    assert sorted({g[2] for g in applied}) == list(range(1, rounds + 1))  # tagged with the round being collected
    assert job.policies.version() == len(applied_log(job)) and job.policies.version() > rounds
    job.delete()


def test_a_retried_push_stores_nothing_and_a_full_stream_pushes_back(job: JobCache) -> None:
    pusher = ActorGradients(job.client, job.keys, maxlen=2, ttl_s=60.0)
    record = GradientRecord(GradientMeta("fused-a", 0, "b1:0:0", 1, {}), {"w": np.array([1.0, 2.0], dtype=np.float32)})
    first = pusher.put("fused-a", record, timeout_s=1.0)
    assert first is not None
    assert pusher.put("fused-a", record, timeout_s=1.0) is None  # the same task id again: a retry
    assert job.gradients.length() == 1
    other = GradientRecord(GradientMeta("fused-a", 0, "b1:0:1", 1, {}), {"w": np.array([3.0, 4.0], dtype=np.float32)})
    assert pusher.put("fused-a", other, timeout_s=1.0) not in (None, first)
    third = GradientRecord(GradientMeta("fused-b", 0, "b2:0:0", 1, {}), {"w": np.array([5.0, 6.0], dtype=np.float32)})
    with pytest.raises(BackpressureTimeout, match="stayed full"):
        pusher.put("fused-b", third, timeout_s=0.05)
    assert job.gradients.length() == 2
    with pytest.raises(ValueError, match="maxlen"):
        ActorGradients(job.client, job.keys, maxlen=0, ttl_s=60.0)
