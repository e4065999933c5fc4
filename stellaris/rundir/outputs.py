"""One run directory: CSVs appended row by row (valid after any interruption), config, checkpoint, final policy."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import save_file

from contract.codec import decode
from contract.packed import unpacked
from contract.results import device_of
from gateway.models import Activation
from stellaris.policy_file import FILE_NAME, policy_metadata
from stellaris.rundir.lock import DirInUse, lock_dir
from stellaris.rundir.tensorboard import RoundBoard
from stellaris.rundir.trigger_log import TRIGGER_COLUMNS, parameter_rows

INFO_COLUMNS = [
    "round_id",
    "duration",
    "num_actors",
    "envs_per_actor",
    "episodes",
    "learner_time",
    "actor_time",
    "train_reward_max",
    "train_reward_mean",
    "train_reward_min",
    "train_reward_std",
    "eval_reward_max",
    "eval_reward_mean",
    "eval_reward_min",
    "eval_reward_std",
    "eval_episodes",
    "staleness_max",
    "staleness_mean",
    "staleness_min",
    "staleness_std",
    "learner_loss",
    "cost",
    "staleness_bound",
    "env_steps",
    "truncated_fraction",
    "aggregations",
    "flushes",
    "clip_fraction",
    "parameter_time",
    "learner_compute_time",
    "parameter_compute_time",
    "cache_time",
    "invocation_overhead",
    "cost_learner",
    "cost_actor",
    "learner_wait_time",
    "dead_lettered",
    "gradients_applied",
    "redis_round_trips",
    "learner_restarts",
    "parameter_restarts",
    "actor_restarts",
]
# Elastic actors and the learner schedule: what changed and what it costs (stellaris/round/scaling.py fills them).
ELASTIC_COLUMNS = [
    "learners",
    "actors",
    "actor_change",
    "actors_prewarmed",
    "actors_per_learner",
    "actor_demand",
    "backlog_steps",
    "batch_wait_s",
    "actor_cost_round_before",
    "actor_cost_round_after",
    "batches_lost",
    "policy_lag",
]
INFO_COLUMNS += ELASTIC_COLUMNS
GRADIENT_COLUMNS = ["gradient_id", "task_id", "round", "base_version", "applied_version"]
TIMELINE_COLUMNS = ["wall_clock_s", "env_steps", "episodic_reward"]
INVOCATION_COLUMNS = [
    "function",
    "activation_id",
    "start",
    "end",
    "cold",
    "init_time",
    "duration",
    "resource_seconds",
    "cost",
    "device",
    "instance",
    "container_id",
    "image",
    "node",
]


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file beside the checkpoint
        exc.filename = exc.filename or str(path)  # a failed write names no file of its own
        raise


def fmt(x: float | None, spec: str = ".1f") -> str:
    """A number for a person to read: '-' for a missing value or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def stats(values: list[float]) -> tuple[float, float, float, float]:
    """(max, mean, min, std), NaN for an empty list."""
    if not values:
        return (float("nan"),) * 4  # type: ignore[return-value]
    a = np.asarray(values, dtype=np.float64)
    return float(a.max()), float(a.mean()), float(a.min()), float(a.std())


def rewrite_csv(path: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    """`path` as a CSV of `columns` holding `rows` (blank where a row lacks a column), replaced atomically."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, text.getvalue().encode())


def _migrated(path: Path, columns: list[str]) -> list[str]:
    """The columns to append under to `path`, a CSV an earlier version may have written with other columns: when its
    header differs, the file is rewritten with `columns` first, then any column only it has (its rows kept whole,
    blank in the columns they lack), so that a resumed run's rows line up with their header and nothing is lost."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        old = list(reader.fieldnames or [])
        if old == columns:
            return columns
        rows, spill = [], 0
        for row in reader:
            # Values past the header's end (a row appended under a shorter header) keep their place by name.
            past = row.pop(None, None) or []
            row.update({f"unnamed_{i + 1}": v for i, v in enumerate(past)})
            rows.append(row)
            spill = max(spill, len(past))
    unnamed = [f"unnamed_{i + 1}" for i in range(spill)]
    merged = list(dict.fromkeys([*columns, *old, *unnamed]))
    rewrite_csv(path, merged, rows)
    return merged


class _Csv:
    def __init__(self, path: Path, columns: list[str]) -> None:
        self.fresh = fresh = not path.exists() or path.stat().st_size == 0
        if not fresh:
            columns = _migrated(path, columns)
        self._append(path, columns)
        if fresh:
            self.writer.writeheader()
            self.file.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.writerows(rows)
        self.file.flush()

    def filter(self, keep: Callable[[dict[str, str]], bool]) -> int:
        """Rewrite the file with only the rows `keep` accepts (atomically); returns how many were dropped."""
        path, columns = Path(self.file.name), list(self.writer.fieldnames)
        self.file.close()
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        # A row with fewer fields than the header was cut short as it was written (a crash, a full disk): it goes.
        kept = [r for r in rows if None not in r.values() and keep(r)]
        rewrite_csv(path, columns, kept)
        self._append(path, columns)
        return len(rows) - len(kept)

    def _append(self, path: Path, columns: list[str]) -> None:
        self.file = path.open("a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns, restval="")

    def close(self) -> None:
        self.file.close()


class _AppliedCsv(_Csv):
    """gradients.csv; each version's group of gradients is also a parameter-trigger firing in triggers.csv."""

    def __init__(self, path: Path, columns: list[str], triggers: _Csv) -> None:
        super().__init__(path, columns)
        self.triggers = triggers

    def write(self, rows: list[dict[str, Any]]) -> None:
        super().write(rows)
        self.triggers.write(parameter_rows(rows))


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message names it and what to do instead."""


RUN_FILES = ("state.json", "info.csv", "config.yaml")  # any of them: the directory holds a run


def read_state(run_dir: Path) -> dict[str, Any] | None:
    """The run's checkpoint state (state.json), None without one."""
    path = run_dir / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


class RunDir:
    """`resume=False` refuses a directory that holds a run already (its CSVs would get a second run's rows)."""

    def __init__(self, path: Path, *, resume: bool = False) -> None:
        self.path = path
        if not resume and any((path / name).exists() for name in RUN_FILES):
            raise RunDirError(
                f"{path} holds a run already: continue it with `stellaris train --resume {path}`, or give a new --out"
            )
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path} is a file, not a run directory (--out)")
        self.created = not path.exists()  # discard() removes only what this run made
        self.wrote_config = False
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.lock = lock_dir(path)  # before any file is touched (stellaris/rundir/lock.py)
        except DirInUse:
            raise RunDirError(
                f"{path} is in use by another `stellaris train` (the run itself, or a resume of it): let it end, or "
                "stop it, then resume"
            ) from None
        self.info = _Csv(path / "info.csv", INFO_COLUMNS)
        self.timeline = _Csv(path / "timeline.csv", TIMELINE_COLUMNS)
        self.invocations = _Csv(path / "invocations.csv", INVOCATION_COLUMNS)
        self.triggers = _Csv(path / "triggers.csv", TRIGGER_COLUMNS)
        self.gradients = _AppliedCsv(path / "gradients.csv", GRADIENT_COLUMNS, self.triggers)
        self.board = RoundBoard(path / "tensorboard")

    def record_round(self, row: dict[str, Any]) -> None:
        """One round's info.csv row, also as TensorBoard scalars."""
        self.info.write([row])
        self.board.write(row)

    def write_config(self, config: dict[str, Any], spec: dict[str, Any]) -> None:
        text = yaml.safe_dump({"config": config, "job_spec": spec}, sort_keys=False)
        self.wrote_config = self.wrote_config or not (self.path / "config.yaml").exists()
        atomic_write(self.path / "config.yaml", text.encode())

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
                    "device": device_of(a.result),  # where the handler computed, as its result record says
                    "instance": a.instance or "",
                    "container_id": a.container_id or "",  # docker backend: the container that ran it
                    "image": a.image or "",
                    "node": a.node or "",  # ray backend: the node's address
                }
                for a in acts
            ]
        )

    def checkpoint(self, state: dict[str, Any], policy: bytes, optimizer: bytes | None) -> None:
        """Policy and optimizer as our wire format (no pickle) in files named by the round, then state.json, which
        names them: a crash at any point leaves state.json naming a complete, matching set. Older sets go last."""
        tag = f"r{int(state['round']):06d}"
        files = {"policy_file": f"policy-{tag}.bin"}
        atomic_write(self.path / files["policy_file"], policy)
        if optimizer:
            files["optimizer_file"] = f"optimizer-{tag}.bin"
            atomic_write(self.path / files["optimizer_file"], optimizer)
        atomic_write(self.path / "state.json", json.dumps({**state, **files}, indent=2).encode())
        for old in [*self.path.glob("policy-r*.bin"), *self.path.glob("optimizer-r*.bin")]:
            if old.name not in files.values():
                old.unlink(missing_ok=True)

    def checkpoint_files(self, state: dict[str, Any]) -> tuple[bytes, bytes]:
        """(policy, optimizer state) of the checkpoint `state` names (b"" for no optimizer state)."""
        policy = (self.path / state.get("policy_file", "policy.bin")).read_bytes()
        optim = self.path / state.get("optimizer_file", "optimizer.bin")
        return policy, optim.read_bytes() if optim.exists() else b""

    def rewind(self, state: dict[str, Any]) -> None:
        """Resuming from `state`: drop the rows a dead run wrote after its last checkpoint (rounds after it, gradients
        applied after its version, episodes after its clock), so the resumed run's rows follow on exactly."""
        keep = {
            self.info: lambda r: int(float(r["round_id"])) <= int(state["round"]),
            self.gradients: lambda r: int(r["applied_version"]) <= int(state["version"]),
            self.timeline: lambda r: float(r["wall_clock_s"]) <= float(state.get("elapsed_s", math.inf)),
            self.triggers: lambda r: int(r["round"]) <= int(state["round"]),
        }
        for table, wanted in keep.items():
            table.filter(wanted)

    def load_state(self) -> dict[str, Any] | None:
        return read_state(self.path)

    def write_final_policy(self, policy: bytes) -> Path:
        """policy.safetensors: the weights (observation statistics included) and, in its metadata, what rebuilds the
        network without this run (`stellaris.policy_file`): the card the policy frame carries (architecture and
        spaces, from the functions side) and the env and algorithm of the job spec that config.yaml holds."""
        frame = decode(policy)
        path = self.path / FILE_NAME
        config = self.path / "config.yaml"
        job_spec = (yaml.safe_load(config.read_text()) or {}).get("job_spec") or {} if config.exists() else {}
        named = unpacked(frame.meta, frame.arrays)  # the file keeps the state_dict's names, packed or not
        arrays = {k: np.array(v, order="C") for k, v in named.items()}  # 0-d stays 0-d (a count)
        save_file(arrays, str(path), metadata=policy_metadata(frame.meta, job_spec))
        return path

    def close(self) -> None:
        """Closes the tables and leaves curve.png (finished or interrupted alike)."""
        from stellaris.plots import write_curve  # matplotlib only when a run ends

        try:
            for f in (self.info, self.timeline, self.invocations, self.gradients, self.triggers):
                f.close()
            self.board.close()
            if (self.path / "state.json").exists():  # a run that finished a round has a curve to draw
                write_curve(self.path)
        finally:
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None

    def discard(self) -> None:
        """After close(), for a run that never started (no checkpoint): remove what it made, the directory itself
        when it made that, so a failed start leaves nothing behind to resume or to refuse the next try."""
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        tables = (self.info, self.timeline, self.invocations, self.gradients, self.triggers)
        made = [Path(t.file.name) for t in tables if t.fresh]
        for path in [*made, *([self.path / "config.yaml"] if self.wrote_config else [])]:
            path.unlink(missing_ok=True)
