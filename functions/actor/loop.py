"""Serverful actors, as in the paper: long-lived processes that call the actor handler in a loop.

Each loop pushes one trajectory batch per iteration and blocks on the trajectory stream's backpressure when
learners fall behind; it stops at the next iteration boundary once its stop event is set. After its first batch an
actor waits for the policy that batch trains before it runs ahead: round 1 is every actor's first batch, whatever the
actors' relative speed, so the same seed gives the same round 1 (docs/training.md). With run-ahead 0 it
never runs ahead: each batch is collected once the round that trained the last one has ended, with the policy that
round published, as a serverless actor invoked between rounds collects it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from typing import Any

from cache import BackpressureTimeout, Cache, CacheSettings, JobCache, JobDataLost
from contract import ActorResult
from functions.handlers import actor
from functions.runtime.context import Context, Instance

log = logging.getLogger("stellaris.actor")
BEAT_S = 1.0  # how often an actor beats; stellaris/platform/actor_watch.py's LOOK_GAP_S spans several


def actor_loop(
    redis_url: str,
    job: str,
    actor_id: str,
    actor_index: int,
    stop: Event,
    max_batches: int | None = None,
    run_ahead: int = 1,
) -> None:
    import torch

    torch.set_num_threads(1)  # one core per actor, as the paper's one actor per vCPU
    with Cache(CacheSettings(url=redis_url)) as cache, _heartbeat(cache, job, actor_id):
        instance = Instance(cache)
        pushed = 0
        while not stop.is_set() and (max_batches is None or pushed < max_batches):
            event: dict[str, Any] = {"job": job, "actor_id": actor_id, "actor_index": actor_index}
            try:
                result = ActorResult.from_dict(actor.handle(event, Context(uuid.uuid4().hex[:12], instance)))
            except BackpressureTimeout as exc:
                # Learners are behind for longer than the bounded wait: drop this batch and keep going rather
                # than die; the queue bound keeps the data fresh.
                log.warning("%s: %s", actor_id, exc)
                continue
            except JobDataLost as exc:  # the control plane reports the loss, once, and starts a new epoch's actors
                log.info("%s: %s", actor_id, exc)
                raise SystemExit(1) from None
            pushed += 1
            if max_batches is not None and pushed >= max_batches:
                break
            if run_ahead == 0:  # the trainer acknowledges (deletes) a batch when the round training it ends
                stream = instance.job(job).trajectories.stream
                while not stop.is_set() and not stream.wait_consumed(result.batch_id, timeout_s=1.0):
                    pass
            elif pushed == 1:
                policies = instance.job(job).policies
                while not stop.is_set() and policies.wait_for_version(result.version, timeout_s=1.0) is None:
                    pass


@contextlib.contextmanager
def _heartbeat(cache: Cache, job: str, actor_id: str) -> Iterator[None]:
    """Raise this actor's count in the job's heartbeat hash every BEAT_S from a thread of its own, while the loop
    runs: the control plane takes an actor whose count stands still for long for hung (its actor_watch.py)."""
    jobc = JobCache(cache.client, job)
    key, ttl_ms = jobc.keys.actor_beats, int(jobc.limits.ttl_s * 1000)
    done = threading.Event()

    def beat() -> None:
        try:
            pipe = cache.client.pipeline(transaction=False)
            pipe.hincrby(key, actor_id, 1)
            pipe.pexpire(key, ttl_ms)
            pipe.execute()
        except Exception as exc:  # Redis away: the next beat tries again (the watch allows for it)
            log.debug("%s: heartbeat failed: %s", actor_id, exc)

    def beats() -> None:
        while not done.wait(BEAT_S):
            beat()

    beat()  # before the first batch: an actor stopped any time after it has a count to be judged by
    thread = threading.Thread(target=beats, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def main() -> None:
    """`python -m functions.actor.loop JOB ACTOR_ID INDEX [RUN_AHEAD]` with $REDIS_URL: one serverful actor until
    SIGTERM (RUN_AHEAD: TrainConfig.actor_run_ahead, 1 when left out)."""
    import os
    import signal
    import sys
    import threading

    job, actor_id, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    run_ahead = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)  # also interrupts a producer blocked on backpressure

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    actor_loop(os.environ["REDIS_URL"], job, actor_id, index, stop, run_ahead=run_ahead)  # type: ignore[arg-type]


if __name__ == "__main__":
    from host.lifetime import quick_exit

    try:
        main()
    except SystemExit as stopped:  # SIGTERM or SIGINT: the batch in hand has landed
        quick_exit(int(stopped.code or 0))
    quick_exit(0)
