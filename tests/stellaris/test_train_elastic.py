"""`stellaris train` with elastic actors and a learner schedule, end to end (real CLI process, embedded Redis, local
gateway, serverful actor processes started and stopped): info.csv against the schedule, the bounds and the
controller's own decisions."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from stellaris.control.elastic import ActorController
from tests.stellaris.test_train import run_train, train_cmd

CHANGE_ROUND, ROUNDS, WINDOW, MIN_ACTORS, MAX_ACTORS = 6, 9, 3, 1, 6


def learners_at(round_k: int) -> int:
    return 1 if round_k < CHANGE_ROUND else 2


@pytest.mark.slow  # 9 rounds, up to 6 actor processes: over 40 s (the long stage)
def test_actor_count_follows_a_learner_change_within_bounds(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = train_cmd(
        tmp_path, "--out", str(out), rounds=ROUNDS, actors=1, learners=1, elastic_actors=True,
        min_actors=MIN_ACTORS, max_actors=MAX_ACTORS, elastic_window=WINDOW,
        learner_schedule=f"1@1,2@{CHANGE_ROUND}",
    )  # fmt: skip
    proc = run_train(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "info.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round_id"]) for r in rows] == list(range(1, ROUNDS + 1))

    # The round protocol's learners follow the schedule.
    assert [int(r["learners"]) for r in rows] == [learners_at(k) for k in range(1, ROUNDS + 1)]

    controller = ActorController(min_actors=MIN_ACTORS, max_actors=MAX_ACTORS, window=WINDOW, lam=0.2)
    for k, row in enumerate(rows, start=1):
        before, after = int(row["num_actors"]), int(row["actors"])
        assert MIN_ACTORS <= after <= MAX_ACTORS
        # Each change is its own row, with its cost effect: the actors' cost per round before and after it.
        assert int(row["actor_change"]) == after - before
        cost_before, cost_after = float(row["actor_cost_round_before"]), float(row["actor_cost_round_after"])
        assert cost_before > 0 and math.isclose(cost_after / cost_before, after / before)
        # The count applied is the one the next round ran with.
        if k < ROUNDS:
            assert int(rows[k]["num_actors"]) == after
        # ... and the one the damped controller gives for the round's recorded demand (planned learners a round
        # ahead): the trainer applies the controller, nothing else moves the count.
        if row["actors_per_learner"] not in ("", "nan"):
            controller.demands.append(float(row["actors_per_learner"]))
            assert controller.decide(before, max(learners_at(k + 1), learners_at(k + 2))) == after
        else:
            assert after == before
        # No batch lost: every batch of every actor, stopped ones included, consumed in sequence.
        assert int(row["batches_lost"]) == 0
        assert float(row["batch_wait_s"]) >= 0.0 and float(row["backlog_steps"]) >= 0.0

    # The actor count follows the learner change (2 learners from CHANGE_ROUND): the measured demand per learner is
    # then doubled; the change is planned, so round k's end already plans for the learners of round k + 2 and the new
    # actors serve the round before the change (pre-warmed). So after rounds CHANGE_ROUND - 2 .. CHANGE_ROUND there
    # are more actors than after round CHANGE_ROUND - 3, the last decided for one learner.
    settled = int(rows[CHANGE_ROUND - 4]["actors"])
    follow = [int(r["actors"]) for r in rows[CHANGE_ROUND - 3 : CHANGE_ROUND]]
    assert max(follow) > settled, (settled, follow, [r["actor_demand"] for r in rows])
    assert sum(int(r["actors_prewarmed"]) for r in rows[CHANGE_ROUND - 3 : CHANGE_ROUND - 1]) > 0
