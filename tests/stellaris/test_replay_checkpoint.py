"""The replay store in checkpoints (stellaris/rundir/replay_files.py) on a real Redis: each batch is written once and
its file goes once a checkpoint no longer holds it; a store put back in a new job's namespace replays exactly what the
dead run's would have; a missing batch file is named; replay.csv loses the dead run's rows after the checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache import BatchMeta, Cache, JobCache, TrajectoryBatch
from contract.records import TRAJECTORY_ARRAYS
from stellaris.round.replay import ReplayRounds
from stellaris.rundir.outputs import RunDirError
from stellaris.rundir.replay_files import FOLDER, ReplayFilesError


def spec(replay: str, capacity: int = 3) -> dict[str, Any]:
    return {"algo": {"replay": replay, "replay_ratio": 0.5, "replay_capacity": capacity}}


def landed(job: JobCache, actor: str, seed: int) -> tuple[str, BatchMeta]:
    """A batch put on the job's trajectory stream and taken by the control plane's group (as a round does)."""
    rng = np.random.default_rng(seed)
    arrays = {k: rng.standard_normal((8, 2)).astype(np.float32) for k in TRAJECTORY_ARRAYS}
    bid = job.trajectories.put(TrajectoryBatch(actor, 0, 8, arrays, {}))
    taken = job.trajectories.take("control", count=1, block_s=1.0)
    assert [i for i, _ in taken] == [bid]
    return taken[0]


def round_of(replay: ReplayRounds, job: JobCache, round_k: int) -> list[str]:
    """One round as the trainer runs it: two fresh batches (actors a0, a1) stored, replayed ids drawn, then acked."""
    batches = [landed(job, f"a{i}", seed=10 * round_k + i) for i in range(2)]
    ids = replay.extend(round_k, batches)
    job.trajectories.ack([bid for bid, _ in batches])
    return ids


def arrivals(replay: ReplayRounds, ids: list[str]) -> list[int]:
    seq = {e.rid: e.seq for e in replay.pattern.store.entries()}  # type: ignore[union-attr]
    return [seq[rid] for rid in ids]


def on_disk(run: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (run / FOLDER).iterdir()}


def test_each_batch_is_written_once_and_its_file_goes_with_its_entry(job: JobCache, tmp_path: Path) -> None:
    replay = ReplayRounds(job, spec("uniform"), seed=1, out_dir=tmp_path)
    seen: dict[str, int] = {}
    for k in range(1, 5):
        round_of(replay, job, k)
        section = replay.checkpoint()
        replay.checkpointed()
        files = on_disk(tmp_path)
        held = [row[0] for row in section["entries"]]
        assert sorted(files) == sorted(f"{rid}.safetensors" for rid in held)  # capacity 3: older ones pruned
        assert all(files[name] == seen[name] for name in files if name in seen)  # never written again
        assert len(set(files) - set(seen)) == min(2, len(held))  # only the round's fresh batches are new
        seen = files
    assert int(section["counters"]["evicted"]) == 5 and section["carry"] == 0.0


@pytest.mark.parametrize("replay_name", ["fifo", "uniform", "prioritized"])
def test_a_restored_store_replays_what_the_dead_runs_would(
    cache_conn: Cache, job: JobCache, job_id: str, tmp_path: Path, replay_name: str
) -> None:
    """Run A checkpoints after round 3 and goes on; run B, in a new namespace, resumes from that checkpoint (through
    JSON, as state.json holds it): its rounds 4 and 5 replay the same batches with the same weights as A's."""
    a = ReplayRounds(job, spec(replay_name, capacity=5), seed=7, out_dir=tmp_path)
    for k in (1, 2, 3):
        round_of(a, job, k)
    if replay_name == "prioritized":
        held = [e.rid for e in a.pattern.store.entries()]  # type: ignore[union-attr]
        a.pattern.update_priorities({rid: 1.0 + i for i, rid in enumerate(held)})
    saved = json.loads(json.dumps(a.checkpoint()))
    a.checkpointed()
    resumed = JobCache(cache_conn.client, f"{job_id}-e1")
    try:
        b = ReplayRounds(resumed, spec(replay_name, capacity=5), seed=7, out_dir=tmp_path)
        assert b.restore(saved, round_k=3) == len(saved["entries"]) == 5
        assert b.pattern.store.entries() == a.pattern.store.entries()  # type: ignore[union-attr]
        for k in (4, 5):  # round 5 replays round-4 batches, which have other ids in B: compared by arrival seq
            assert arrivals(b, round_of(b, resumed, k)) == arrivals(a, round_of(a, job, k)) != []
            assert list(b.weights.values()) == list(a.weights.values())
    finally:
        resumed.delete()


def test_a_missing_batch_file_is_named(cache_conn: Cache, job: JobCache, job_id: str, tmp_path: Path) -> None:
    a = ReplayRounds(job, spec("uniform"), seed=1, out_dir=tmp_path)
    round_of(a, job, 1)
    saved = a.checkpoint()
    gone = tmp_path / FOLDER / f"{saved['entries'][0][0]}.safetensors"
    gone.unlink()
    resumed = JobCache(cache_conn.client, f"{job_id}-e1")
    try:
        b = ReplayRounds(resumed, spec("uniform"), seed=1, out_dir=tmp_path)
        with pytest.raises(ReplayFilesError, match=str(gone)) as failed:
            b.restore(saved, round_k=1)
        assert isinstance(failed.value, RunDirError)  # the CLI's one-line error, exit 2
    finally:
        resumed.delete()


def test_resume_drops_the_dead_runs_replay_rows_after_its_checkpoint(
    cache_conn: Cache, job: JobCache, job_id: str, tmp_path: Path
) -> None:
    a = ReplayRounds(job, spec("fifo"), seed=1, out_dir=tmp_path)
    round_of(a, job, 1)
    saved = a.checkpoint()
    round_of(a, job, 2)  # the dead run's round 2: a row, but no checkpoint
    resumed = JobCache(cache_conn.client, f"{job_id}-e1")
    try:
        b = ReplayRounds(resumed, spec("fifo"), seed=1, out_dir=tmp_path)
        b.restore(saved, round_k=1)
        round_of(b, resumed, 2)
    finally:
        resumed.delete()
    rows = list(csv.DictReader((tmp_path / "replay.csv").open()))
    assert [r["round"] for r in rows] == ["1", "2"]
