"""The scale model's pure parts (docs/scale-model.md): the latency model's draws, the event core's schedule and arrival
order, the cost and the report, against numbers worked out by hand. No torch, no envs: the work is a stand-in that
applies what the test says."""

from __future__ import annotations

import math
import statistics

import pytest

from gateway.models import ACTOR_PRICING, LEARNER_PRICING
from stellaris.plan.cost import round_cost
from stellaris.plan.events import Landing, Published, Start, run_round
from stellaris.plan.latency import (
    CalibrationRun,
    ClusterLatency,
    LatencyModel,
    arrival_jitter,
    arrival_stamps,
    calibrated_overheads,
    ready_times,
    starts_cold,
    task_seconds,
)
from stellaris.plan.report import RoundRow, compare_rows, summarize


class Applies:
    """The parameter function as the test's rule: `async` applies the oldest landed gradient on its own; `sync`
    applies the whole queue once nothing is in flight. Every task measures `measured_s`; each apply takes `apply_s`."""

    def __init__(self, rule: str, *, measured_s: float = 1.0, apply_s: float = 0.0) -> None:
        self.rule, self.measured_s, self.apply_s = rule, measured_s, apply_s
        self.queue: list[Landing] = []
        self.applied: list[tuple[int, int]] = []  # (task, staleness) in the order applied
        self.in_flight_seen: list[tuple[int, ...]] = []

    def compute(self, start: Start) -> float:
        return self.measured_s

    def land(self, landing: Landing) -> None:
        self.queue.append(landing)

    def queued(self) -> int:
        return len(self.queue)

    def decide(self, version: int, in_flight: tuple[int, ...]) -> float | None:
        self.in_flight_seen.append(in_flight)
        if self.rule == "sync" and in_flight:
            return None
        count = 1 if self.rule == "async" else len(self.queue)
        used, self.queue = self.queue[:count], self.queue[count:]
        self.applied += [(g.task, version - g.version) for g in used]
        return self.apply_s


def _starts(starts: list[Start]) -> list[tuple[int, int, float, int]]:
    return [(s.task, s.learner, s.time, s.version) for s in starts]


def _landings(landings: list[Landing]) -> list[tuple[int, int, float, float]]:
    return [(g.task, g.learner, g.start, g.end) for g in landings]


def test_two_learners_four_tasks_worked_by_hand() -> None:
    """Learners of speeds 1 and 2 (learner 1 takes twice as long), a cold start of 0.5 s, four tasks of 1.0 s each,
    applies that take no time, each gradient applied on its own:

    - 0.5: both are ready; learner 0 takes task 0 (0.5 -> 1.5), learner 1 task 1 (0.5 -> 2.5), both on version 0.
    - 1.5: task 0 lands and is applied (staleness 0): version 1. Learner 0 takes task 2 on version 1 (1.5 -> 2.5);
      learner 1 holds version 0, which task 2 truncates against.
    - 2.5: task 1 lands (it started first), then task 2; they are applied in that order, each 1 version stale:
      versions 2 and 3. Learner 1 takes task 3 on version 3 (2.5 -> 4.5); learner 0 finds the queue empty.
    - 4.5: task 3 lands and is applied (staleness 0): version 4, the round's end.
    """
    latency = ClusterLatency.given(LatencyModel(cold_start_s=0.5), [1.0, 2.0])
    work = Applies("async")
    trace = run_round(
        work, steps=[4], ready=latency.ready_at(1, 0.0), stretch=latency.task_seconds, version=0, claim_ahead=False
    )
    assert trace.ready == (0.5, 0.5)
    assert _starts(trace.starts) == [(0, 0, 0.5, 0), (1, 1, 0.5, 0), (2, 0, 1.5, 1), (3, 1, 2.5, 3)]
    assert [s.others for s in trace.starts] == [(), (), (0,), ()]
    assert [s.first for s in trace.starts] == [True, True, False, False]
    assert _landings(trace.landings) == [(0, 0, 0.5, 1.5), (1, 1, 0.5, 2.5), (2, 0, 1.5, 2.5), (3, 1, 2.5, 4.5)]
    assert work.applied == [(0, 0), (1, 1), (2, 1), (3, 0)]
    assert trace.published == [
        Published(1, 1.5, 1.5),
        Published(2, 2.5, 2.5),
        Published(3, 2.5, 2.5),
        Published(4, 4.5, 4.5),
    ]
    # At the first decision task 1 runs on version 0, tasks 2 and 3 wait (they will take the newest): all 0.
    assert work.in_flight_seen[0] == (0, 0, 0)
    assert trace.end == 4.5 and trace.last_landing == 4.5


@pytest.mark.parametrize(
    ("claim_ahead", "versions", "stalenesses"),
    [
        # Claiming ahead, task 2 is claimed as task 1 starts (1.0), before task 0's update is out (1.25): version 0.
        (True, [0, 0, 0], [0, 1, 2]),
        # Claiming after each computation, task 1 is claimed at 1.0 (version 0), task 2 at 2.0 (version 1).
        (False, [0, 0, 1], [0, 1, 1]),
    ],
)
def test_one_learner_claiming_ahead_worked_by_hand(
    claim_ahead: bool, versions: list[int], stalenesses: list[int]
) -> None:
    """One learner, no cold start, three tasks of 1.0 s, applies of 0.25 s: tasks run 0-1, 1-2, 2-3; versions are
    published at 1.25, 2.25 and 3.25."""
    latency = ClusterLatency.given(LatencyModel(cold_start_s=0.0), [1.0])
    work = Applies("async", apply_s=0.25)
    trace = run_round(
        work,
        steps=[3],
        ready=latency.ready_at(1, 0.0),
        stretch=latency.task_seconds,
        version=0,
        claim_ahead=claim_ahead,
    )
    assert [(s.time, s.version) for s in trace.starts] == list(zip([0.0, 1.0, 2.0], versions, strict=True))
    assert [staleness for _, staleness in work.applied] == stalenesses
    assert [(p.version, p.time) for p in trace.published] == [(1, 1.25), (2, 2.25), (3, 3.25)]
    assert trace.end == 3.25


def test_sync_steps_wait_for_the_update_worked_by_hand() -> None:
    """Sync, 2 learners of speeds 1 and 2, no cold start, two steps of 2 tasks of 1.0 s, applies of 0.5 s:

    - step 1 on version 0: learner 0 0 -> 1, learner 1 0 -> 2; at 1 the rule waits for task 1 (in flight);
      at 2 it applies both: version 1 at 2.5.
    - step 2 is enqueued at 2.5, on version 1: learner 0 2.5 -> 3.5, learner 1 2.5 -> 4.5; version 2 at 5.0.
    """
    latency = ClusterLatency.given(LatencyModel(cold_start_s=0.0), [1.0, 2.0])
    work = Applies("sync", apply_s=0.5)
    trace = run_round(
        work,
        steps=[2, 2],
        ready=latency.ready_at(1, 0.0),
        stretch=latency.task_seconds,
        version=0,
        claim_ahead=False,
    )
    assert _starts(trace.starts) == [(0, 0, 0.0, 0), (1, 1, 0.0, 0), (2, 0, 2.5, 1), (3, 1, 2.5, 1)]
    assert [g.end for g in trace.landings] == [1.0, 2.0, 3.5, 4.5]
    assert work.applied == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert [(p.version, p.time) for p in trace.published] == [(1, 2.5), (2, 5.0)]
    assert work.in_flight_seen[:2] == [(0,), ()]


def test_a_rule_that_never_applies_is_named() -> None:
    class Never(Applies):
        def decide(self, version: int, in_flight: tuple[int, ...]) -> float | None:
            return None

    latency = ClusterLatency.given(LatencyModel(cold_start_s=0.0), [1.0])
    with pytest.raises(RuntimeError, match="1 gradient\\(s\\) queued"):
        run_round(Never("async"), steps=[1], ready=[0.0], stretch=latency.task_seconds, version=0, claim_ahead=False)


def test_the_round_takes_learners_and_positive_steps() -> None:
    work = Applies("async")
    with pytest.raises(ValueError, match="at least one learner"):
        run_round(work, steps=[1], ready=[], stretch=lambda i, m: m, version=0, claim_ahead=False)
    with pytest.raises(ValueError, match="positive task counts"):
        run_round(work, steps=[0], ready=[0.0], stretch=lambda i, m: m, version=0, claim_ahead=False)


# --- the latency model ----------------------------------------------------------------------------------------------


def test_a_task_is_stretched_by_slowdown_and_straggling() -> None:
    rng = ClusterLatency.draw(LatencyModel(), 1, seed=0).task_rng
    assert task_seconds(LatencyModel(), 0.5, 2.0, rng) == 1.0  # no straggling, no jitter: slowdown alone
    stragglers = LatencyModel(straggler_p=1.0, straggler_factor=4.0)
    assert task_seconds(stragglers, 0.5, 2.0, rng) == 4.0


def test_a_task_pays_the_overhead_unstretched() -> None:
    rng = ClusterLatency.draw(LatencyModel(), 1, seed=0).task_rng
    assert task_seconds(LatencyModel(task_overhead_s=0.25), 0.5, 2.0, rng) == 1.25


def test_a_prewarmed_cold_start_overlaps_the_collection() -> None:
    """Learner 0 cold, learner 1 warm; the batch lands at 2.0. Pre-warmed from the round's start (0.0), a 1.5 s start
    is over by then; from 1.0, learner 0 is ready at 2.5; without pre-warming it starts when invoked: 3.5."""
    model = LatencyModel(cold_start_s=1.5)
    assert ready_times(model, [True, False], 2.0, started_at=0.0) == [2.0, 2.0]
    assert ready_times(model, [True, False], 2.0, started_at=1.0) == [2.5, 2.0]
    assert ready_times(LatencyModel(cold_start_s=1.5, prewarm=False), [True, False], 2.0, started_at=0.0) == [3.5, 2.0]
    assert ready_times(model, [True], 2.0) == [3.5]  # no round start given: the instance starts when invoked


def test_cold_starts_are_round_ones_and_then_drawn() -> None:
    rng = ClusterLatency.draw(LatencyModel(), 1, seed=0).cold_rng
    assert starts_cold(LatencyModel(cold_start_p=0.0), 1, rng)
    assert not any(starts_cold(LatencyModel(cold_start_p=0.0), k, rng) for k in range(2, 50))
    assert all(starts_cold(LatencyModel(cold_start_p=1.0), k, rng) for k in range(2, 50))
    warm = ClusterLatency.given(LatencyModel(cold_start_s=2.0), [1.0, 1.0])
    assert warm.ready_at(1, 10.0) == [12.0, 12.0] and warm.ready_at(2, 20.0) == [20.0, 20.0]


def _draws(model: LatencyModel, seed: int) -> tuple[tuple[float, ...], list[float], list[list[float]]]:
    cluster = ClusterLatency.draw(model, 4, seed=seed)
    tasks = [cluster.task_seconds(i % 4, 1.0) for i in range(40)]
    return cluster.slowdowns, tasks, [cluster.ready_at(k, 0.0) for k in range(1, 6)]


def test_the_draws_repeat_under_a_seed_and_differ_across_seeds() -> None:
    model = LatencyModel(cold_start_p=0.3, straggler_p=0.2, jitter_sigma=0.5, speed_spread=1.0)
    first = _draws(model, seed=3)
    assert first == _draws(model, seed=3)
    assert first[0] != _draws(model, seed=4)[0] and first[1] != _draws(model, seed=4)[1]
    assert all(1.0 <= s <= 2.0 for s in first[0])
    assert any(t > 2.0 * 4.0 / 2 for t in first[1])  # some straggled
    assert {r for ready in first[2][1:] for r in ready} == {0.0, 1.5}  # later rounds: some cold, some warm


def test_one_knob_does_not_shift_the_others_draws() -> None:
    """Each task draws twice whatever the knobs: turning stragglers on changes only the tasks that straggle."""
    plain = _draws(LatencyModel(jitter_sigma=0.3), seed=1)[1]
    straggly = _draws(LatencyModel(jitter_sigma=0.3, straggler_p=0.1, straggler_factor=3.0), seed=1)[1]
    ratios = {round(b / a, 9) for a, b in zip(plain, straggly, strict=True)}
    assert ratios == {1.0, 3.0}


def test_the_jitter_has_mean_one() -> None:
    cluster = ClusterLatency.draw(LatencyModel(jitter_sigma=0.5), 1, seed=0)
    stretches = [cluster.task_seconds(0, 1.0) for _ in range(20_000)]
    assert statistics.fmean(stretches) == pytest.approx(1.0, abs=0.02)
    assert statistics.median(stretches) == pytest.approx(math.exp(-0.125), abs=0.02)  # exp(-σ²/2)


def test_the_knobs_are_bounded() -> None:
    with pytest.raises(ValueError, match="straggler_p"):
        LatencyModel(straggler_p=1.5)
    with pytest.raises(ValueError, match="straggler_factor"):
        LatencyModel(straggler_factor=0.5)
    with pytest.raises(ValueError, match="positive"):
        ClusterLatency.given(LatencyModel(), [1.0, 0.0])
    with pytest.raises(ValueError, match="at least 1 learner"):
        ClusterLatency.draw(LatencyModel(), 0, seed=0)


# --- cost and report ------------------------------------------------------------------------------------------------


def test_the_cost_of_a_round_worked_by_hand() -> None:
    learner_s, actor_s = LEARNER_PRICING.usd_per_second, ACTOR_PRICING.usd_per_second  # $3.06/h/4, $4.896/h/128
    args = {"actors": 2, "round_s": 4.0, "actor_s": [1.0, 1.5], "learner_s": [2.0, 1.0], "parameter_s": 3.0}
    serverless = round_cost(billing="serverless", actor_kind="serverful", **args)  # type: ignore[arg-type]
    assert serverless.learner == pytest.approx(6.0 * learner_s)  # 2 + 1 learner seconds, 3 parameter seconds
    assert serverless.actor == pytest.approx(2 * 4.0 * actor_s)  # serverful actors, held the whole round
    actors_billed = round_cost(billing="serverless", actor_kind="serverless", **args)  # type: ignore[arg-type]
    assert actors_billed.actor == pytest.approx(2.5 * actor_s)
    held = round_cost(billing="serverful", actor_kind="serverful", **args)  # type: ignore[arg-type]
    assert held.learner == pytest.approx(3 * 4.0 * learner_s)  # 2 learners and the parameter server
    assert held.total == pytest.approx(held.learner + 2 * 4.0 * actor_s)
    assert learner_s == pytest.approx(3.06 / 3600 / 4)


def _row(round_id: int, *, staleness: float, applied: int, ret: float, cost: float) -> RoundRow:
    return RoundRow(
        round_id=round_id,
        learners=2,
        env_steps=100 * round_id,
        wall_clock_s=10.0 * round_id,
        duration=10.0,
        actor_time=4.0,
        learn_time=6.0,
        cost=cost,
        cost_learner=cost,
        cost_actor=0.0,
        train_reward_mean=ret,
        episodes=3,
        eval_reward_mean=math.nan,
        eval_episodes=0,
        staleness_mean=staleness,
        staleness_max=staleness,
        gradients_applied=applied,
        aggregations=applied,
        flushes=0,
        cold_starts=0,
        learner_compute_time=1.0,
        parameter_compute_time=0.1,
    )


def test_the_summary_weighs_staleness_by_gradients() -> None:
    rows = [
        _row(1, staleness=1.0, applied=10, ret=5.0, cost=0.1),
        _row(2, staleness=4.0, applied=30, ret=7.0, cost=0.3),
    ]
    summary = summarize(rows)
    assert summary.staleness_mean == pytest.approx((10 * 1.0 + 30 * 4.0) / 40)
    assert (summary.rounds, summary.env_steps, summary.wall_clock_s, summary.cost) == (2, 200, 20.0, 0.3)
    assert summary.final_return == 7.0 and math.isnan(summary.eval_return) and summary.gradients_applied == 40


def test_the_comparison_pairs_rounds_both_have() -> None:
    info = [
        {
            "round_id": "1",
            "train_reward_mean": "4.5",
            "staleness_mean": "1.0",
            "gradients_applied": "10",
            "aggregations": "10",
            "duration": "12.5",
            "cost": "0.2",
        },
        {
            "round_id": "3",
            "train_reward_mean": "",
            "staleness_mean": "nan",
            "gradients_applied": "10",
            "aggregations": "9",
            "duration": "9.0",
            "cost": "0.4",
        },
    ]
    compared = compare_rows(info, [_row(1, staleness=2.0, applied=10, ret=5.0, cost=0.1)])
    assert len(compared) == 1
    row = compared[0]
    assert (row["round_id"], row["real_train_reward_mean"], row["model_train_reward_mean"]) == (1, 4.5, 5.0)
    assert (row["real_staleness_mean"], row["model_staleness_mean"], row["real_duration"]) == (1.0, 2.0, 12.5)


def _info(
    duration: float,
    actor: float,
    compute: float,
    applied: float,
    learner: float,
    learner_wait: float,
    cache: float,
    param_compute: float,
    aggs: float,
) -> dict[str, float]:
    return {
        "learners": 1.0,
        "duration": duration,
        "actor_time": actor,
        "learner_compute_time": compute,
        "gradients_applied": applied,
        "learner_time": learner,
        "learner_wait_time": learner_wait,
        "cache_time": cache,
        "parameter_compute_time": param_compute,
        "aggregations": aggs,
    }


def test_overheads_calibrated_from_a_one_learner_run_by_hand() -> None:
    rows = [
        _info(9.0, 1.0, 0.1, 10, 8.0, 0.0, 5.0, 0.1, 10),  # round 1: the cold start, left out
        # a task: (1.5 - 0.8 - 0.38) / 320 = 1 ms; the learner's busy time 0.6 - 0.38 = 0.22 of the 0.56 cache time,
        # so the parameter function's 0.34, plus its 0.1 of compute, over 220 applies: 2 ms
        _info(1.5, 0.8, 0.38, 320, 0.6, 0.0, 0.56, 0.1, 220),
        # (1.7 - 0.8 - 0.26) / 320 = 2 ms; the learner waited 0.1: busy 0.14, the parameter 0.5 + 0.1 over 150: 4 ms
        _info(1.7, 0.8, 0.26, 320, 0.5, 0.1, 0.64, 0.1, 150),
        # a phase shorter than the compute: 0 ms; a cache time below the learner's busy time: compute alone, 3 ms
        _info(1.0, 0.6, 0.30, 100, 0.4, 0.0, 0.05, 0.3, 100),
    ]
    measured = calibrated_overheads([CalibrationRun(rows)])
    assert measured.rounds == 3
    assert measured.task_overhead_s == pytest.approx(0.001)  # the median of 1, 2 and 0 ms
    assert measured.apply_s == pytest.approx(0.003)  # the median of 2, 4 and 3 ms
    assert measured.compute_s == pytest.approx(0.0011875)  # the median of 0.38/320, 0.26/320 and 0.30/100 s
    assert measured.collect_s == pytest.approx(0.8)  # the median of 0.8, 0.8 and 0.6 s
    assert measured.jitter_sigma is None  # no arrivals given
    # each round's timings together, to draw from: round 2's 1.1875 ms compute, 1 ms overhead, 2 ms apply, 0.8 s
    first = measured.per_round[0]
    assert (first.compute_s, first.task_overhead_s, first.apply_s, first.collect_s) == pytest.approx(
        (0.38 / 320, 0.001, 0.002, 0.8)
    )
    assert [t.apply_s for t in measured.per_round] == pytest.approx([0.002, 0.004, 0.003])
    # pooled with a second run: its round 1 left out too; its one round joins the medians: a task (1.44 - 0.8)
    # / 320 = 2 ms, an apply (0.48 - 0.04) / 220 = 2 ms
    other = [rows[0], _info(1.44, 0.8, 0.0, 320, 0.04, 0.0, 0.48, 0.0, 220)]
    pooled = calibrated_overheads([CalibrationRun(rows), CalibrationRun(other)])
    assert pooled.rounds == 4
    assert pooled.task_overhead_s == pytest.approx(0.0015)  # the median of 1, 2, 0 and 2 ms
    assert pooled.apply_s == pytest.approx(0.0025)  # the median of 2, 4, 3 and 2 ms


def test_calibration_refuses_what_it_cannot_divide() -> None:
    one = _info(1.5, 0.8, 0.38, 320, 0.6, 0.0, 0.56, 0.1, 220)
    with pytest.raises(ValueError, match="one-learner run: this one ran 4 learners"):
        calibrated_overheads([CalibrationRun([{**one, "learners": 4.0}] * 2)])
    idle = _info(1.0, 1.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0, 0)
    with pytest.raises(ValueError, match="no round after the first applied a gradient"):
        calibrated_overheads([CalibrationRun([one, idle])])


def test_arrival_gaps_are_read_off_stream_ids_within_each_round_after_the_first() -> None:
    gradients = [(1, "100-0"), (1, "150-0"), (2, "200-0"), (2, "203-0"), (2, "203-1"), (2, "201-0"), (3, "500-0")]
    gradients += [(3, "504-0")]
    # round 1 left out; round 2 sorted 200, 201, 203, 203: gaps 1, 2, 0; round 3: 4; no gap across rounds
    assert arrival_stamps(gradients) == {1: [100.0, 150.0], 2: [200.0, 201.0, 203.0, 203.0], 3: [500.0, 504.0]}


def test_arrival_jitter_by_hand() -> None:
    # gaps 1, 3, 1, 3 ms: sample variance 4/3 ms²; less the rounding's 1/6: 7/6 ms², sd 1.0801 ms; over a 2 ms
    # compute cv = 0.54006, σ = √ln(1 + 0.29167) = 0.50590
    assert arrival_jitter([[1.0, 3.0, 1.0, 3.0]], 0.002) == pytest.approx(math.sqrt(math.log(1 + 7 / 6 / 4)))
    assert arrival_jitter([[1.0, 3.0, 1.0, 3.0]], 0.002) == pytest.approx(0.50590, abs=1e-5)
    assert arrival_jitter([[2.0, 2.0, 2.0]], 0.002) == 0.0  # no spread beyond the rounding's
    # each gap from its own round's mean: rounds of 2 ms and 6 ms gaps spread between rounds, not within
    assert arrival_jitter([[2.0, 2.0, 2.0], [6.0, 6.0], [9.0]], 0.002) == 0.0
    # within: (1, 3) about 2 and (5, 7) about 6, four squares of 1 over 2 degrees of freedom: 2 ms², less 1/6
    assert arrival_jitter([[1.0, 3.0], [5.0, 7.0]], 0.002) == pytest.approx(math.sqrt(math.log(1 + (11 / 6) / 4)))
    with pytest.raises(ValueError, match="compute must be positive"):
        arrival_jitter([[1.0, 2.0]], 0.0)
    with pytest.raises(ValueError, match="a round with two gaps or more"):
        arrival_jitter([[1.0], [2.0]], 0.002)
    # through the calibration: the gaps' σ over the runs' median compute
    rows = [_info(1.0, 0.8, 0.1, 10, 0.2, 0.0, 0.1, 0.0, 10)] * 2  # compute 0.1 / 10 = 10 ms a task
    rows = [{**r, "round_id": float(k)} for k, r in enumerate(rows, 1)]
    measured = calibrated_overheads([CalibrationRun(rows, {2: [0.0, 1.0, 4.0, 5.0, 8.0]})])  # gaps 1, 3, 1, 3
    assert measured.jitter_sigma == pytest.approx(math.sqrt(math.log(1 + 7 / 6 / 100)))


def test_a_rounds_task_is_its_arrivals_cadence_not_its_learning_phase() -> None:
    # 320 gradients, 0.32 s of compute (1 ms each); the phase beyond the collection is 1.2 - 0.6 = 0.6 s, 1.875 ms
    # a gradient, but it held the drain of the parameter function's queue after the last arrival: the gradients
    # arrived 1.25 ms apart (mean gap), so a task's overhead is 0.25 ms, not the phase's 0.875
    row = {**_info(1.2, 0.6, 0.32, 320, 0.5, 0.0, 0.4, 0.2, 320), "round_id": 2.0}
    first = {**row, "round_id": 1.0}
    stamps = [5000.0, 5001.0, 5003.0, 5004.0, 5005.0]  # ms: gaps 1, 2, 1 and 1, a mean of 1.25 ms
    by_cadence = calibrated_overheads([CalibrationRun([first, row], {2: stamps})])
    assert by_cadence.task_overhead_s == pytest.approx(0.00025)
    no_arrivals = calibrated_overheads([CalibrationRun([first, row])])
    assert no_arrivals.task_overhead_s == pytest.approx(0.000875)  # the phase's share
    # a round without arrivals of its own falls back to its phase; a round's stamps stay with their own run
    assert calibrated_overheads([CalibrationRun([first, row], {3: stamps})]).task_overhead_s == pytest.approx(0.000875)
    two = calibrated_overheads([CalibrationRun([first, row], {2: stamps}), CalibrationRun([first, row])])
    assert sorted(t.task_overhead_s for t in two.per_round) == pytest.approx([0.00025, 0.000875])
    # the round's start: no invocations, none measured; with them, the phase (0.6 s) less the first task (1.25 ms)
    # and less the stretch from the first arrival (5.0 s) to the end of the last invocation running then (the
    # parameter function's, 5.45 s): 0.14875 s; an invocation that ended before the arrival does not count
    assert by_cadence.start_s is None and by_cadence.per_round[0].start_s == 0.0
    spans = [(3.0, 4.0), (4.9, 5.4), (4.95, 5.45)]
    started = calibrated_overheads([CalibrationRun([first, row], {2: stamps}, spans)])
    assert started.start_s == pytest.approx(0.14875) and started.per_round[0].start_s == pytest.approx(0.14875)
    assert calibrated_overheads([CalibrationRun([first, row], {}, spans)]).start_s is None  # no arrivals
    # sync: each arrival also waited for the last step's apply, its share taken out: the learner's busy time
    # 0.5 - 0.32 = 0.18 of the 0.4 cache time, the parameter's 0.22 plus its 0.2 of compute, over 320: 1.3125 ms;
    # with gaps of 3 ms, the overhead is 3 - 1 - 1.3125 = 0.6875 ms
    sync = calibrated_overheads([CalibrationRun([first, row], {2: [0.0, 3.0, 6.0]})], waits_for_applies=True)
    assert sync.apply_s == pytest.approx(0.0013125) and sync.task_overhead_s == pytest.approx(0.0006875)
    assert sync.jitter_sigma is None  # its gaps spread as its applies and waits do, not as its tasks


def test_a_sync_run_takes_its_applies_out_of_the_tasks_overhead() -> None:
    # a sync learner waits for each step's update: the phase beyond compute, 3.2 - 0.8 - 0.5 = 1.9 s, held the
    # applies too: the parameter function's 0.18 s of compute plus its busy 1.66 - (2.4 - 0.5 - 1.0) = 0.76 s, 0.94
    # s over 320 applies (2.9375 ms each); the tasks' overhead is the rest, 0.96 s / 320 = 3 ms
    row = _info(3.2, 0.8, 0.5, 320, 2.4, 1.0, 1.66, 0.18, 320)
    sync = calibrated_overheads([CalibrationRun([row, row])], waits_for_applies=True)
    assert sync.apply_s == pytest.approx(0.0029375) and sync.task_overhead_s == pytest.approx(0.003)
    overlapped = calibrated_overheads(
        [CalibrationRun([row, row])]
    )  # applies beside the tasks: the whole phase is the tasks'
    assert overlapped.task_overhead_s == pytest.approx(1.9 / 320) and overlapped.apply_s == sync.apply_s
