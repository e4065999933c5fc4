"""TensorBoard event files of a run: one scalar per info.csv column per round, the round as the step. Written with
tensorboard's own event writer, as torch's SummaryWriter does it, without importing torch into the control plane
(1.1 s of its start here)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

# info.csv column -> TensorBoard tag, grouped so the dashboard shows returns, staleness, throughput, cost, latency.
TAGS = {
    "train_reward_mean": "return/mean",
    "train_reward_max": "return/max",
    "train_reward_min": "return/min",
    "train_reward_std": "return/std",
    "episodes": "return/episodes",
    "staleness_mean": "staleness/mean",
    "staleness_max": "staleness/max",
    "staleness_bound": "staleness/bound",
    "aggregations": "learner/aggregations",
    "flushes": "learner/flushes",
    "learner_loss": "learner/loss",
    "truncated_fraction": "learner/truncated_fraction",
    "clip_fraction": "learner/clip_fraction",
    "gradients_applied": "learner/gradients_applied",
    "env_steps": "throughput/env_steps",
    "cost": "cost/total",
    "cost_learner": "cost/learner",
    "cost_actor": "cost/actor",
    "duration": "latency/round",
    "learner_time": "latency/learner",
    "actor_time": "latency/actor",
    "parameter_time": "latency/parameter",
    "cache_time": "latency/cache",
    "invocation_overhead": "latency/invocation_overhead",
    "learner_wait_time": "latency/learner_wait",
}
# Deterministic evaluation (--eval-every): written only in the rounds that evaluated, so no empty points between.
EVAL_TAGS = {
    "eval_reward_mean": "eval/return_mean",
    "eval_reward_max": "eval/return_max",
    "eval_reward_min": "eval/return_min",
    "eval_reward_std": "eval/return_std",
    "eval_episodes": "eval/episodes",
}


class RoundBoard:
    """Writes each round's scalars under `path`. Opened at the first round written, with that round as the purge
    step, so a resumed run's events replace any a dead run wrote after its checkpoint: no step appears twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: EventFileWriter | None = None
        self.last_steps: float | None = None

    def _open(self, purge_step: int) -> EventFileWriter:
        writer = EventFileWriter(str(self.path))
        # A session (re)start at `purge_step`: TensorBoard drops the events of this file's directory from that step on.
        writer.add_event(Event(wall_time=time.time(), step=purge_step, file_version="brain.Event:2"))
        writer.add_event(Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        return writer

    def _scalar(self, tag: str, value: float, step: int) -> None:
        assert self.writer is not None
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def write(self, row: dict[str, Any]) -> None:
        step = int(float(row["round_id"]))
        if self.writer is None:
            self.writer = self._open(step)
            self.last_steps = 0.0 if step <= 1 else None  # resumed: the steps before this round are not known here
        evaluated = (_number(row.get("eval_episodes")) or 0) > 0
        for column, tag in (TAGS | EVAL_TAGS if evaluated else TAGS).items():
            value = _number(row.get(column))
            if value is not None:
                self._scalar(tag, value, step)
        duration, steps = _number(row.get("duration")), _number(row.get("env_steps"))
        if duration and steps is not None and self.last_steps is not None:
            self._scalar("throughput/env_steps_per_s", (steps - self.last_steps) / duration, step)
        self.last_steps = steps
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _number(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v
