"""One run directory: CSVs appended row by row (valid after any interruption), config, checkpoint, final policy."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import save_file

from cache.codec import decode
from gateway.models import Activation

INFO_COLUMNS = [
    "round_id", "duration", "num_actors", "envs_per_actor", "episodes", "learner_time", "actor_time",
    "eval_reward_max", "eval_reward_mean", "eval_reward_min", "eval_reward_std",
    "staleness_max", "staleness_mean", "staleness_min", "staleness_std",
    "learner_loss", "cost", "staleness_bound", "env_steps", "truncated_fraction", "aggregations", "flushes",
    "parameter_time", "learner_compute_time", "parameter_compute_time", "cache_time", "invocation_overhead",
    "cost_learner", "cost_actor", "learner_wait_time", "dead_lettered", "gradients_applied", "redis_round_trips",
    "learner_restarts", "parameter_restarts", "actor_restarts",
]  # fmt: skip
GRADIENT_COLUMNS = ["gradient_id", "task_id", "round", "base_version", "applied_version"]
TIMELINE_COLUMNS = ["wall_clock_s", "episodic_reward"]
INVOCATION_COLUMNS = [
    "function", "activation_id", "start", "end", "cold", "init_time", "duration", "resource_seconds", "cost",
]  # fmt: skip


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def fmt(x: float | None, spec: str = ".1f") -> str:
    """A number for a person to read: '-' for a missing value or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def stats(values: list[float]) -> tuple[float, float, float, float]:
    """(max, mean, min, std), NaN for an empty list."""
    if not values:
        return (float("nan"),) * 4  # type: ignore[return-value]
    a = np.asarray(values, dtype=np.float64)
    return float(a.max()), float(a.mean()), float(a.min()), float(a.std())


class _Csv:
    def __init__(self, path: Path, columns: list[str]) -> None:
        fresh = not path.exists() or path.stat().st_size == 0
        self.file = path.open("a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns)
        if fresh:
            self.writer.writeheader()
            self.file.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.writerows(rows)
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.info = _Csv(path / "info.csv", INFO_COLUMNS)
        self.timeline = _Csv(path / "timeline.csv", TIMELINE_COLUMNS)
        self.invocations = _Csv(path / "invocations.csv", INVOCATION_COLUMNS)
        self.gradients = _Csv(path / "gradients.csv", GRADIENT_COLUMNS)

    def write_config(self, config: dict[str, Any], spec: dict[str, Any]) -> None:
        text = yaml.safe_dump({"config": config, "job_spec": spec}, sort_keys=False)
        _atomic_write(self.path / "config.yaml", text.encode())

    def record_invocations(self, acts: list[Activation]) -> None:
        self.invocations.write(
            [
                {
                    "function": a.function,
                    "activation_id": a.id,
                    "start": a.start,
                    "end": a.end,
                    "cold": a.cold,
                    "init_time": a.init_s,
                    "duration": a.duration_s,
                    "resource_seconds": a.resource_seconds,
                    "cost": a.cost_usd,
                }
                for a in acts
            ]
        )

    def checkpoint(self, state: dict[str, Any], policy: bytes, optimizer: bytes | None) -> None:
        """Policy and optimizer as our wire format (no pickle), then state.json last: it names a complete set."""
        _atomic_write(self.path / "policy.bin", policy)
        if optimizer:
            _atomic_write(self.path / "optimizer.bin", optimizer)
        _atomic_write(self.path / "state.json", json.dumps(state, indent=2).encode())

    def load_state(self) -> dict[str, Any] | None:
        path = self.path / "state.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_final_policy(self, policy: bytes) -> Path:
        frame = decode(policy)
        path = self.path / "policy.safetensors"
        arrays = {k: np.ascontiguousarray(v) for k, v in frame.arrays.items()}
        save_file(arrays, str(path), metadata={"version": str(frame.meta.get("version", ""))})
        return path

    def close(self) -> None:
        for f in (self.info, self.timeline, self.invocations, self.gradients):
            f.close()
