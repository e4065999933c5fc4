"""`experiments.bench_faults`' table from hand-made runs: the job ratio and the cost of one kill."""

from __future__ import annotations

import pytest

from experiments.bench_faults import Run, rows_of


def test_the_rows_are_the_job_ratio_and_the_cost_per_kill_with_their_spread() -> None:
    pairs = [
        (Run([0.2] * 10, kills=0, restarts=0), Run([0.2] * 10 + [2.0], kills=2, restarts=2)),  # 2.0 / 2.0 s
        (Run([0.25] * 10, kills=0, restarts=0), Run([0.25] * 10 + [3.0], kills=2, restarts=1)),  # 5.5 / 2.5 s
        (Run([0.3] * 10, kills=0, restarts=0), Run([0.3] * 10 + [1.0], kills=1, restarts=1)),  # 4.0 / 3.0 s
    ]
    job, kill = rows_of(pairs, "learner", 5)
    assert job.ratio == pytest.approx(2.0)  # ratios 2.0, 2.2, 1.333...
    assert job.ours == "4.0 s" and job.baseline == "2.5 s without kills"  # B sums 4.0, 5.5, 4.0
    assert "ratio 1.33-2.20" in job.note and "kills per run [2, 2, 1]" in job.note
    assert kill.ours == "1.00 s"  # per kill: 1.0, 1.5, 1.0
    assert kill.baseline == "0.25 s per unhurt round"
    assert kill.ratio == pytest.approx(4.0)
    assert "1.00-1.50 s" in kill.note


def test_a_pair_without_a_kill_adds_no_cost_figure() -> None:
    pairs = [
        (Run([0.2] * 4, kills=0, restarts=0), Run([0.2] * 4, kills=0, restarts=0)),
        (Run([0.2] * 4, kills=0, restarts=0), Run([0.2] * 3 + [1.2], kills=1, restarts=1)),
    ]
    _, kill = rows_of(pairs, "parameter", 3)
    assert kill.ours == "1.00 s" and kill.benchmark == "cost of one parameter kill"


def test_no_kill_landing_leaves_the_cost_row_out() -> None:
    pairs = [(Run([0.2] * 4, kills=0, restarts=0), Run([0.3] * 4, kills=0, restarts=0))]
    (job,) = rows_of(pairs, "actor", 3)
    assert job.ratio == pytest.approx(1.5)
