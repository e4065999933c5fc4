"""The control plane's side of replay (cache/replay): per round, the round's fresh batches are copied into the
job's replay store before they are acknowledged, and replayed batch ids are appended to the round's batch list at
the configured ratio, so every (epoch, minibatch) task trains on fresh and replayed data alike. Prioritized replay's
importance weights travel on the round's tasks (`weigh`), one per batch, for the learners' loss. `full_batch` (the
default, and every algorithm without replay settings) keeps today's rounds exactly: no replay key is written.

Each round of a replaying run appends a row to `RUN/replay.csv`: fresh and replayed batches, the store's entries
and payload bytes (now, peak, bound), evictions so far, and the replayed batches' mean importance weight. The store
is checkpointed with the run (stellaris/rundir/replay_files.py), so a resumed run replays what the dead one held.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cache import BatchMeta, JobCache, LearnerTask
from cache.replay import ReplaySettings, make_pattern, replay_id
from cache.replay.pattern import replay_count
from stellaris.rundir.outputs import rewrite_csv
from stellaris.rundir.replay_files import ReplayFiles

REPLAY_COLUMNS = [
    "round",
    "pattern",
    "fresh_batches",
    "replayed_batches",
    "entries",
    "bytes",
    "peak_bytes",
    "bytes_max",
    "evicted",
    "mean_weight",
]


class ReplayRounds:
    """One job's replay between rounds; `out_dir` (the run directory) gets replay.csv when the job replays."""

    def __init__(self, job: JobCache, spec: Mapping[str, Any], *, seed: int, out_dir: Path | None = None) -> None:
        self.settings = ReplaySettings.of_spec(spec)
        self.pattern = make_pattern(self.settings, job.client, job.keys, seed=seed, ttl_s=job.limits.ttl_s)
        self.carry = 0.0  # the fraction of a replayed batch owed to the next round (`replay_count`)
        self.weights: dict[str, float] = {}  # replay id -> importance weight, of the last round's sample
        self.rows_path = out_dir / "replay.csv" if out_dir is not None and self.replays else None
        self.files = ReplayFiles(out_dir) if out_dir is not None and self.replays else None
        self.kept: list[str] = []  # replay ids the last checkpoint holds

    @property
    def replays(self) -> bool:
        return self.pattern.store is not None

    def extend(self, round_k: int, batches: Sequence[tuple[str, BatchMeta]]) -> list[str]:
        """Store the round's fresh batches (still unacknowledged on the stream) and return the replay ids the round
        trains on besides them: drawn from earlier rounds' batches only, so the fresh ones are never trained twice
        in one round, and none of them is evicted before the round ends (the control plane is the only writer)."""
        if self.pattern.store is None:
            return []
        self.pattern.add([(bid, meta.actor_id) for bid, meta in batches])
        n, self.carry = replay_count(len(batches), self.settings.replay_ratio, self.carry)
        sample = self.pattern.sample(n, round_k=round_k, exclude={replay_id(bid) for bid, _ in batches})
        self.weights = dict(zip(sample.ids, sample.weights, strict=True))
        self._record(round_k, len(batches), sample.ids, sample.weights)
        return list(sample.ids)

    def weigh(self, tasks: Sequence[LearnerTask]) -> list[LearnerTask]:
        """The round's tasks carrying each batch's importance weight from the last `extend` (1.0 for a fresh one).
        Where every weight is 1.0 (fresh batches only, or any pattern but prioritized) the tasks stay as they are."""
        if all(w == 1.0 for w in self.weights.values()):
            return list(tasks)
        return [replace(t, batch_weights=tuple(self.weights.get(b, 1.0) for b in t.batch_ids)) for t in tasks]

    def checkpoint(self) -> dict[str, Any]:
        """A checkpoint's replay section, after writing the batches no earlier checkpoint wrote; {} without replay."""
        if self.files is None or self.pattern.store is None:
            return {}
        section = self.files.save(self.pattern.store) | {"pattern": self.pattern.state(), "carry": self.carry}
        self.kept = [row[0] for row in section["entries"]]
        return section

    def checkpointed(self) -> None:
        """The checkpoint's state.json is written: the files of batches it no longer holds go."""
        if self.files is not None:
            self.files.prune(self.kept)

    def restore(self, section: Mapping[str, Any] | None, *, round_k: int) -> int:
        """On resume from the checkpoint of round `round_k`: replay.csv loses the dead run's rows of later rounds,
        and the store and the pattern get back what the checkpoint kept. Returns the entries put back."""
        if self.rows_path is not None and self.rows_path.exists():
            with self.rows_path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            rewrite_csv(self.rows_path, REPLAY_COLUMNS, [r for r in rows if int(r["round"]) <= round_k])
        if not section or self.files is None or self.pattern.store is None:
            return 0
        put = self.files.restore(self.pattern.store, section)
        self.pattern.restore(section.get("pattern") or {})
        self.carry = float(section.get("carry", 0.0))
        return put

    def _record(self, round_k: int, fresh: int, ids: Sequence[str], weights: Sequence[float]) -> None:
        if self.rows_path is None or self.pattern.store is None:
            return
        state = self.pattern.store.state()
        row = {
            "round": round_k,
            "pattern": self.settings.replay,
            "fresh_batches": fresh,
            "replayed_batches": len(ids),
            "entries": state.entries,
            "bytes": state.bytes,
            "peak_bytes": state.peak_bytes,
            "bytes_max": self.pattern.store.bytes_max,
            "evicted": state.evicted,
            "mean_weight": round(sum(weights) / len(weights), 6) if weights else "",
        }
        fresh_file = not self.rows_path.exists()
        with self.rows_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=REPLAY_COLUMNS)
            if fresh_file:
                writer.writeheader()
            writer.writerow(row)
