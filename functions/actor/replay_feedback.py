"""The learner's side of prioritised replay: a gradient's batch priorities (functions/algos/replay_priority.py)
written to the job's replay store, where entries still held take them (an evicted one stays gone)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cache import JobCache, LearnerTask
from functions.algos.replay_priority import priorities_of


def write_priorities(job: JobCache, task: LearnerTask, stats: Mapping[str, Any]) -> int:
    """Store the priorities in `stats` for the task's batches (fresh ones under their replay id); how many held."""
    priorities = priorities_of(stats, task.batch_ids)
    store = job.trajectories.replay
    return store.update_priorities(priorities) if priorities and store is not None else 0
