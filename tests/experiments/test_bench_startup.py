"""`experiments.bench_startup`' table from hand-made job timings: each phase's median, min–max and ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench_startup import PHASES, rows_of


def _job(setup: float, total: float) -> dict[str, float]:
    return {"setup": setup, "first round": 1.0, "finish": 0.5, "exit": 0.1, "total": total}


def test_each_phase_is_a_row_with_medians_spread_and_ratio() -> None:
    ours = [_job(4.0, 6.0), _job(5.0, 7.0), _job(4.5, 6.5)]
    base = [_job(5.0, 10.0), _job(6.0, 12.0), _job(5.5, 11.0)]
    rows = rows_of(ours, base, Path("/tmp/base"))
    assert [r.benchmark for r in rows] == [f"short job: {p} (s)" for p in PHASES]
    setup, first, *_, total = rows
    assert setup.ours == "4.50 (4.00-5.00)" and setup.baseline == "5.50 (5.00-6.00)"
    assert setup.ratio == pytest.approx(4.5 / 5.5)
    assert total.ratio == pytest.approx(6.5 / 11.0)
    assert first.ratio == pytest.approx(1.0)
    assert "3 pairs" in total.note and "/tmp/base" in total.note
