"""Prioritised replay's priority of a batch from a learner's output: the mean |V-trace advantage| over the batch's
samples in the task's time chunk (plus ε, so that no batch becomes unsampleable). Pure: tensors in, floats out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

PRIORITY_PREFIX = "replay_priority/"  # a gradient's stats key, followed by the batch's index in the task
PRIORITY_EPS = 1e-6


def batch_priorities(advantages: Tensor, columns: Sequence[int], *, eps: float = PRIORITY_EPS) -> list[float]:
    """mean |A| of each batch: `advantages` is time-major [T, N]; batch b owns the next `columns[b]` of the N env
    columns (the task's batches concatenated in order, as `functions.learner.learn.time_chunk` does)."""
    if sum(columns) != advantages.shape[1]:
        raise ValueError(f"batch columns {list(columns)} do not add up to the advantages' {advantages.shape[1]} envs")
    out, lo = [], 0
    for width in columns:
        out.append(float(advantages[:, lo : lo + width].detach().abs().mean()) + eps)
        lo += width
    return out


def replay_priority_stats(cfg: Any, advantages: Tensor, batches: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The gradient-stats entries carrying each batch's priority, only where the config uses prioritized replay."""
    if getattr(cfg, "replay", "full_batch") != "prioritized":
        return {}
    columns = [int(b["rewards"].shape[1]) for b in batches]
    return {f"{PRIORITY_PREFIX}{i}": p for i, p in enumerate(batch_priorities(advantages, columns))}


def priorities_of(stats: Mapping[str, Any], batch_ids: Sequence[str]) -> dict[str, float]:
    """{batch id: priority} from a gradient's stats (the task's batch ids in order); empty without priorities."""
    return {
        batch_ids[int(k.removeprefix(PRIORITY_PREFIX))]: float(v)
        for k, v in stats.items()
        if k.startswith(PRIORITY_PREFIX)
    }
