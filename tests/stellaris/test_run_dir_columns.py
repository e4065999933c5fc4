"""A run directory an earlier version wrote, resumed: its CSVs get this version's header before a row is appended,
so every row lines up with its columns and no value already stored is lost (RunDir, through the real files)."""

from __future__ import annotations

import csv
from pathlib import Path

from stellaris.rundir.outputs import GRADIENT_COLUMNS, INFO_COLUMNS, RunDir


def _write(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _row(round_id: int) -> dict[str, float]:
    return {c: float(i) for i, c in enumerate(INFO_COLUMNS)} | {"round_id": round_id, "clip_fraction": 0.25}


def test_an_older_header_gains_the_new_columns_and_keeps_its_own(tmp_path: Path) -> None:
    old = [c for c in INFO_COLUMNS if c != "clip_fraction"] + ["retired_column"]
    values = [[str(r) if c == "round_id" else f"{r}.{i}" for i, c in enumerate(old)] for r in (1, 2)]
    _write(tmp_path / "info.csv", old, values)

    run = RunDir(tmp_path, resume=True)
    run.info.write([_row(3)])
    run.info.close()

    header, rows = _read(tmp_path / "info.csv")
    assert header == [*INFO_COLUMNS, "retired_column"]
    assert [r["round_id"] for r in rows] == ["1", "2", "3"]
    for r, stored in zip(rows[:2], values, strict=True):
        assert [r[c] for c in old] == stored  # every stored value under its own column
        assert r["clip_fraction"] == ""  # a column the older version did not write: blank (NaN to readers)
    assert rows[2]["clip_fraction"] == "0.25"
    assert rows[2]["retired_column"] == ""
    assert rows[2]["duration"] == str(float(INFO_COLUMNS.index("duration")))


def test_values_past_a_shorter_header_are_kept_by_name(tmp_path: Path) -> None:
    """Rows that an earlier resume appended under a shorter header (more values than the header names)."""
    short = GRADIENT_COLUMNS[:-1]
    _write(tmp_path / "gradients.csv", short, [["g1", "t1", "1", "0", "7", "8"]])

    run = RunDir(tmp_path, resume=True)
    run.gradients.close()

    header, rows = _read(tmp_path / "gradients.csv")
    assert header == [*GRADIENT_COLUMNS, "unnamed_1", "unnamed_2"]
    assert (rows[0]["unnamed_1"], rows[0]["unnamed_2"]) == ("7", "8")
    assert rows[0][GRADIENT_COLUMNS[0]] == "g1"


def test_a_current_header_is_left_as_it_is(tmp_path: Path) -> None:
    _write(tmp_path / "info.csv", INFO_COLUMNS, [[str(i) for i in range(len(INFO_COLUMNS))]])
    before = (tmp_path / "info.csv").read_bytes()

    RunDir(tmp_path, resume=True).info.close()

    assert (tmp_path / "info.csv").read_bytes() == before


def test_a_resume_drops_a_row_cut_short_as_it_was_written(tmp_path: Path) -> None:
    """A crash or a full disk mid-append leaves a last row with fewer fields than the header (here round 3's, cut to
    "1": it would read as round 1): the rewind drops it and keeps every complete row of the checkpoint's rounds."""
    full = [[str(r) if c == "round_id" else f"{r}.{i}" for i, c in enumerate(INFO_COLUMNS)] for r in (1, 2)]
    _write(tmp_path / "info.csv", INFO_COLUMNS, [*full, ["1"]])
    grads = [[f"g{v}", f"t{v}", "1", str(v - 1), str(v)] for v in (1, 2, 3)]
    _write(tmp_path / "gradients.csv", GRADIENT_COLUMNS, [*grads, ["g4", "t4", "2"]])

    run = RunDir(tmp_path, resume=True)
    run.rewind({"round": 2, "version": 3, "elapsed_s": 10.0})
    run.info.write([_row(3)])
    run.info.close()
    run.gradients.close()

    assert [r["round_id"] for r in _read(tmp_path / "info.csv")[1]] == ["1", "2", "3"]
    assert [r["applied_version"] for r in _read(tmp_path / "gradients.csv")[1]] == ["1", "2", "3"]
