"""The elastic-actor controller (stellaris/round/elastic.py) against hand-computed numbers, the learner schedule's
parsing and the config's bounds, and the batch sequence that tells a lost batch."""

from __future__ import annotations

import math

import pytest

from cache import BatchMeta
from stellaris.config import ConfigError, load_config
from stellaris.elastic_options import parse_learner_schedule
from stellaris.round.elastic import (
    ActorController,
    Signal,
    actor_cost_per_round,
    actors_per_learner,
    backlog_gain_for,
)
from stellaris.round.scaling import BatchSequence, actor_steps_s, policy_lag, resumed_actors


def sig(c: float = 1000.0, r: float = 500.0, b: float = 2048.0, batch: float = 2048.0, learners: int = 2) -> Signal:
    return Signal(consume_steps_s=c, actor_steps_s=r, backlog_steps=b, batch_steps=batch, learners=learners)


def test_demand_per_learner_hand_computed() -> None:
    # c/r = 1000/500 = 2 actors; one batch waiting is on target (factor 1); per learner of 2: 1.0
    assert actors_per_learner(sig()) == pytest.approx(1.0)
    # nothing waiting: shortfall (2048-0)/2048 = 1 -> factor 1 + 0.5*1 = 1.5 -> 2*1.5/2 = 1.5
    assert actors_per_learner(sig(b=0.0)) == pytest.approx(1.5)
    # half a batch waiting: shortfall 0.5 -> factor 1.25 -> 1.25
    assert actors_per_learner(sig(b=1024.0)) == pytest.approx(1.25)
    # three batches waiting: shortfall clipped to -1 -> factor 0.5 -> 0.5
    assert actors_per_learner(sig(b=3 * 2048.0)) == pytest.approx(0.5)
    # gain 0.2, nothing waiting: factor 1.2 -> 1.2; one learner: c/r = 1.2/1
    assert actors_per_learner(sig(b=0.0, learners=1), backlog_gain=0.2) == pytest.approx(2.4)


def test_without_run_ahead_the_backlog_corrects_nothing() -> None:
    # Run-ahead 0: an actor collects its next batch only once its last was trained on, so nothing waits when
    # learning ends, at any actor count. Gain 0: c/r = 2 actors, 1.0 per learner of 2, not 1.5.
    assert backlog_gain_for(0) == 0.0 and backlog_gain_for(1) == 0.5 and backlog_gain_for(4, gain=0.3) == 0.3
    assert actors_per_learner(sig(b=0.0), backlog_gain=backlog_gain_for(0)) == pytest.approx(1.0)
    assert actors_per_learner(sig(b=0.0), backlog_gain=backlog_gain_for(1)) == pytest.approx(1.5)


@pytest.mark.parametrize("field", ["consume_steps_s", "actor_steps_s", "batch_steps"])
def test_demand_rejects_non_positive_rates_naming_the_field(field: str) -> None:
    bad = {"consume_steps_s": 1000.0, "actor_steps_s": 500.0, "batch_steps": 2048.0, field: 0.0}
    with pytest.raises(ValueError, match=field):
        actors_per_learner(Signal(backlog_steps=0.0, learners=1, **bad))


def test_holds_until_the_window_is_full_then_moves_to_the_median() -> None:
    ctl = ActorController(min_actors=1, max_actors=8, window=5, lam=0.2)
    for _ in range(4):
        ctl.observe(sig(b=0.0))  # 1.5 actors per learner -> 3 for 2 learners
        assert ctl.decide(actors=1, learners=2) == 1  # window not full: no decision on start-up rounds
    ctl.observe(sig(b=0.0))
    assert ctl.wanted(2) == pytest.approx(3.0)
    assert ctl.decide(actors=1, learners=2) == 3


def test_no_oscillation_on_a_constant_signal() -> None:
    ctl = ActorController(min_actors=1, max_actors=8, window=5, lam=0.2)
    actors, changes = 1, 0
    for _ in range(50):
        ctl.observe(sig(c=1250.0))  # c/r = 2.5 -> 1.25 per learner -> 2.5 wanted: on a rounding boundary
        new = ctl.decide(actors=actors, learners=2)
        changes += new != actors
        actors = new
    # one move (1 -> round(2.5 + 0.5 floor) = 3), then the dead band max(0.2*3, 0.5) = 0.6 > |2.5 - 3| holds it
    assert (actors, changes) == (3, 1)


def test_no_oscillation_on_a_noisy_signal_inside_the_dead_band() -> None:
    ctl = ActorController(min_actors=1, max_actors=8, window=5, lam=0.2)
    actors, history = 4, []
    for k in range(40):
        ctl.observe(sig(c=2000.0 * (1.15 if k % 2 else 0.85)))  # 2 per learner ±15%: wanted 3.4 or 4.6
        actors = ctl.decide(actors=actors, learners=2)
        history.append(actors)
    assert set(history) == {4}  # medians 3.4..4.6 are within 0.2*4 = 0.8 of 4


def test_step_response_moves_after_the_median_does() -> None:
    ctl = ActorController(min_actors=1, max_actors=8, window=5, lam=0.2)
    actors = 2
    for _ in range(5):
        ctl.observe(sig())  # 1 per learner, 2 learners: 2 actors, steady
        actors = ctl.decide(actors=actors, learners=2)
    assert actors == 2
    trace = []
    for _ in range(5):
        ctl.observe(sig(c=2000.0))  # consumption doubles: 2 per learner
        actors = ctl.decide(actors=actors, learners=2)
        trace.append(actors)
    # window medians after 1, 2, 3 new samples: 1, 1, 2 per learner -> the count moves on the third round
    assert trace == [2, 2, 4, 4, 4]


def test_a_planned_learner_change_scales_the_count_at_once() -> None:
    ctl = ActorController(min_actors=1, max_actors=8, window=5, lam=0.2)
    for _ in range(5):
        ctl.observe(sig())  # 1 actor per learner
    assert ctl.decide(actors=2, learners=2) == 2
    assert ctl.decide(actors=2, learners=4) == 4  # feed-forward: no round has measured 4 learners yet
    assert ctl.decide(actors=2, learners=16) == 8  # clamped to max_actors
    assert ctl.decide(actors=2, learners=1) == 1  # |1 - 2| = 1 > max(0.2*2, 0.5): down to 1


def test_bounds_and_dead_band_going_down() -> None:
    ctl = ActorController(min_actors=2, max_actors=8, window=1, lam=0.2)
    ctl.observe(sig(c=100.0))  # 0.1 per learner: wanted 0.2 for 2 learners
    assert ctl.decide(actors=5, learners=2) == 2  # clamped to min_actors
    ctl = ActorController(min_actors=1, max_actors=8, window=1, lam=0.2)
    ctl.observe(sig(c=1000.0))  # 1 per learner
    assert ctl.decide(actors=5, learners=4) == 5  # wanted 4: |4 - 5| = 1 <= 0.2*5 = 1, inside the band
    assert ctl.decide(actors=6, learners=4) == 4  # |4 - 6| = 2 > 1.2


def test_controller_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min_actors"):
        ActorController(min_actors=3, max_actors=2)
    with pytest.raises(ValueError, match="window"):
        ActorController(min_actors=1, max_actors=2, window=0)
    with pytest.raises(ValueError, match="lam"):
        ActorController(min_actors=1, max_actors=2, lam=1.0)


def test_actor_cost_per_round_from_the_price() -> None:
    # c6a.32xlarge $4.896/h over 128 cores: $1.0625e-5 per core-second; 3 actors for 10 s
    assert actor_cost_per_round(3, 10.0) == pytest.approx(3 * 10.0 * 4.896 / 3600 / 128)


def meta(actor: str, seq: int | None, steps: int = 100, span: tuple[float, float] | None = (0.0, 1.0)) -> BatchMeta:
    info: dict[str, object] = {} if seq is None else {"batch_seq": seq}
    if span is not None:
        info["collect_span"] = list(span)
    return BatchMeta(actor_id=actor, behaviour_version=0, env_steps=steps, info=info)


def test_batch_sequence_counts_gaps_and_restarts() -> None:
    seq = BatchSequence()
    assert seq.lost([("1", meta("a", 0)), ("2", meta("b", 0)), ("3", meta("a", 1))]) == 0
    assert seq.lost([("4", meta("a", 3))]) == 1  # batch 2 of actor a never came
    assert seq.lost([("5", meta("a", 0)), ("6", meta("b", None))]) == 0  # a restarted; b's header has no number


def test_actor_rate_over_collection_spans() -> None:
    batches = [("1", meta("a", 0, 100, (10.0, 11.0))), ("2", meta("b", 0, 300, (10.0, 13.0)))]
    assert actor_steps_s(batches) == pytest.approx(400 / 4.0)
    assert actor_steps_s([("1", meta("a", 0, span=None))]) is None


def test_policy_lag_counts_versions_from_the_oldest_collecting_policy() -> None:
    def at(version: int) -> tuple[str, BatchMeta]:
        return ("1", BatchMeta(actor_id="a", behaviour_version=version, env_steps=100, info={}))

    assert policy_lag([at(7), at(4)], 9) == 5  # the oldest of the round's batches, to the version learning starts at
    assert policy_lag([at(9)], 9) == 0
    assert math.isnan(policy_lag([], 9)) and math.isnan(policy_lag([at(3)], None))


def test_learner_schedule_parses() -> None:
    assert parse_learner_schedule("2@1, 4@15") == [(1, 2), (15, 4)]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"learner_schedule": "2@1,four@3"}, "learner_schedule: 'four@3'"),
        ({"learner_schedule": "2@1,4@1"}, "rounds must increase"),
        ({"learner_schedule": "2@1,0@4"}, "outside"),
        ({"learner_schedule": "3@1", "learners": 2}, "learner_schedule: round 1 has 3 learners but learners is 2"),
        ({"min_actors": 3, "max_actors": 2}, "min_actors: 3 is above max_actors: 2"),
        ({"elastic_actors": True, "actors": 5, "max_actors": 4}, "actors: 5 is outside"),
        ({"elastic_window": 0}, "elastic_window"),
        ({"elastic_lambda": 1.5}, "elastic_lambda"),
    ],
)
def test_config_errors_name_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(None, {"env": "CartPole-v1", "rounds": 2, **fields})


def test_config_learners_follow_the_schedule() -> None:
    fields = {"learners": 2, "learner_schedule": "2@1,4@15", "elastic_actors": True}
    cfg = load_config(None, {"env": "CartPole-v1", "rounds": 2, **fields})
    assert [cfg.learners_at(k) for k in (1, 14, 15, 99)] == [2, 2, 4, 4]
    assert (cfg.learner_capacity, cfg.actor_capacity) == (4, cfg.max_actors)
    assert cfg.queue_bound == cfg.max_actors  # sized for the most actors the job may run, a batch each at run-ahead 0


@pytest.mark.parametrize(("actors", "run_ahead", "bound"), [(1, 1, 1), (1, 2, 2), (3, 2, 6), (2, 0, 2)])
def test_queue_bound_is_run_ahead_batches_per_actor(actors: int, run_ahead: int, bound: int) -> None:
    # 1 actor x 1: its next batch waits for the round training on its last one to end (no floor of 2)
    fields = {"actors": actors, "actor_run_ahead": run_ahead}
    assert load_config(None, {"env": "CartPole-v1", "rounds": 2, **fields}).queue_bound == bound


def test_run_ahead_0_is_refused_where_actors_ship_gradients_naming_both_fields() -> None:
    fields = {"actor_run_ahead": 0, "distribution": "gradients_at_actors"}
    with pytest.raises(ConfigError, match=r"actor_run_ahead: 0 .* gradients_at_actors"):
        load_config(None, {"env": "CartPole-v1", "rounds": 2, **fields})
    # Left unset, run-ahead is 0 for trajectory batches and 1 where actors ship gradients.
    assert load_config(None, {"env": "CartPole-v1", "rounds": 2}).actor_run_ahead == 0
    shipping = load_config(None, {"env": "CartPole-v1", "rounds": 2, "distribution": "gradients_at_actors"})
    assert shipping.actor_run_ahead == 1


def test_a_resumed_run_starts_from_the_actor_count_it_had_reached() -> None:
    elastic = {"env": "CartPole-v1", "rounds": 2, "elastic_actors": True, "min_actors": 1, "max_actors": 4}
    cfg = load_config(None, elastic)
    assert cfg.actors == 1
    assert resumed_actors(cfg, {"actors": 3, "demands": [1.5]}).actors == 3
    assert resumed_actors(cfg, {"actors": 9}).actors == 4  # within the bounds the resumed config sets
    assert resumed_actors(cfg, {}).actors == 1  # a checkpoint from before elastic state was kept
    fixed = load_config(None, {"env": "CartPole-v1", "rounds": 2, "actors": 2})
    assert resumed_actors(fixed, {"actors": 3}).actors == 2  # only elastic actors move the count
