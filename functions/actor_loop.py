"""Serverful actors, as in the paper: long-lived processes that call the actor handler in a loop.

Each loop pushes one trajectory batch per iteration and blocks on the trajectory stream's backpressure when
learners fall behind; it stops at the next iteration boundary once its stop event is set.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import uuid
from multiprocessing.synchronize import Event
from typing import Any

from cache import BackpressureTimeout, Cache, CacheSettings
from functions.context import Context, Instance
from functions.handlers import actor

log = logging.getLogger("stellaris.actor")


def actor_loop(
    redis_url: str, job: str, actor_id: str, actor_index: int, stop: Event, max_batches: int | None = None
) -> None:
    import torch

    torch.set_num_threads(1)  # one core per actor, as the paper's one actor per vCPU
    with Cache(CacheSettings(url=redis_url)) as cache:
        instance = Instance(cache)
        pushed = 0
        while not stop.is_set() and (max_batches is None or pushed < max_batches):
            event: dict[str, Any] = {"job": job, "actor_id": actor_id, "actor_index": actor_index}
            try:
                actor.handle(event, Context(uuid.uuid4().hex[:12], instance))
            except BackpressureTimeout as exc:
                # Learners are behind for longer than the bounded wait: drop this batch and keep going rather
                # than die; the queue bound keeps the data fresh.
                log.warning("%s: %s", actor_id, exc)
                continue
            pushed += 1


class ActorPool:
    """N serverful actor processes for one job. Use as a context manager; `stop()` joins them."""

    def __init__(self, redis_url: str, job: str, num_actors: int, *, max_batches: int | None = None) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors must be at least 1, got {num_actors}")
        ctx = mp.get_context("spawn")  # no inherited locks, sockets or torch threads
        self.stop_event = ctx.Event()
        self.processes = [
            ctx.Process(
                target=actor_loop,
                args=(redis_url, job, f"actor-{i}", i, self.stop_event, max_batches),
                name=f"stellaris-actor-{i}",
                daemon=True,
            )
            for i in range(num_actors)
        ]

    def start(self) -> ActorPool:
        for p in self.processes:
            p.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for p in self.processes:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join()

    def __enter__(self) -> ActorPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m functions.actor_loop JOB ACTOR_ID INDEX` with $REDIS_URL: one serverful actor until SIGTERM."""
    import os
    import signal
    import sys
    import threading

    job, actor_id, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)  # also interrupts a producer blocked on backpressure

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    actor_loop(os.environ["REDIS_URL"], job, actor_id, index, stop)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
