"""The replay store in a run's checkpoints, written incrementally: each held batch is written once, the first time a
checkpoint finds it in the store, as `RUN/replay/<replay id>.safetensors` (its stream fields as uint8 arrays, their
order in the metadata: no pickle); state.json lists the held entries (id, actor, arrival seq, priority) and the
store's counters. A batch's file goes once a state.json without it has been written, so the state.json on disk
always names files that exist, and the disk holds at most the store's bound (`replay_capacity_mb`) plus one round."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from cache.replay import ReplayEntry, ReplayStore
from stellaris.rundir.outputs import RunDirError, atomic_write

FOLDER = "replay"
SUFFIX = ".safetensors"


class ReplayFilesError(RunDirError):
    """A checkpoint's replay batch that cannot be written or read back; the message names it."""


def _name(field: bytes) -> str:
    return field.decode("latin-1")  # any bytes, one char each: safetensors names are str


class ReplayFiles:
    """One run directory's replay batches."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = run_dir / FOLDER

    def path(self, rid: str) -> Path:
        return self.folder / f"{rid}{SUFFIX}"

    def save(self, store: ReplayStore) -> dict[str, Any]:
        """Write the files of entries not on disk yet; returns the checkpoint's section: entries and counters."""
        entries = store.entries()
        self.folder.mkdir(parents=True, exist_ok=True)
        for e in entries:
            if self.path(e.rid).exists():
                continue
            fields = store.read(e.rid)
            if fields is None:  # the control plane is the store's only writer: nothing evicts between the calls
                raise ReplayFilesError(f"replay entry {e.rid} vanished from the store while it was checkpointed")
            self._write(e.rid, fields)
        rows = [[e.rid, e.actor, e.seq, e.priority] for e in entries]
        return {"entries": rows, "counters": store.counters()}

    def _write(self, rid: str, fields: Mapping[bytes, bytes]) -> None:
        arrays = {_name(k): np.frombuffer(v, dtype=np.uint8) for k, v in fields.items()}
        atomic_write(self.path(rid), save(arrays, metadata={"fields": json.dumps([_name(k) for k in fields])}))

    def prune(self, keep: Iterable[str]) -> int:
        """Remove the files of batches the written state.json no longer holds (and any half-written one)."""
        wanted = {f"{rid}{SUFFIX}" for rid in keep}
        gone = 0
        for path in self.folder.glob("*") if self.folder.is_dir() else ():
            if path.name not in wanted:
                path.unlink(missing_ok=True)
                gone += 1
        return gone

    def restore(self, store: ReplayStore, section: Mapping[str, Any]) -> int:
        """Put a checkpoint's entries back into `store`, oldest first, then its counters; returns the entries put."""
        put = 0
        for rid, actor, seq, priority in section.get("entries") or []:
            entry = ReplayEntry(str(rid), str(actor), int(seq), 0, None if priority is None else float(priority))
            put += store.put(entry, self.read(entry.rid)).added
        store.set_counters({str(k): str(v) for k, v in (section.get("counters") or {}).items()})
        return put

    def read(self, rid: str) -> dict[bytes, bytes]:
        path = self.path(rid)
        try:
            with safe_open(path, framework="numpy") as f:
                order = json.loads(f.metadata()["fields"])  # the stream's field order
                return {name.encode("latin-1"): f.get_tensor(name).tobytes() for name in order}
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
            raise ReplayFilesError(f"replay batch {path} cannot be read back: {exc}") from exc
