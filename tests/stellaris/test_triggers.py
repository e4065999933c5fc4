"""Trigger evaluation against hand-made facts (pure), config validation naming the field, and the learner gate's
checkpointed state."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest

from cache import JobCache
from contract.triggers import ParameterTrigger
from stellaris.config import ConfigError, load_config
from stellaris.round.protocol import LearnerGate
from stellaris.round.triggers import LandedFacts, LearnerTrigger
from stellaris.rundir.trigger_log import parameter_rows

CARTPOLE = {"env": "CartPole-v1", "rounds": 1}


def facts(**kw: object) -> LandedFacts:
    base: dict[str, object] = dict(
        round=2, batches=0, steps=0, actors=0, version=5, fired_version=5, since_fire_s=math.inf
    )
    return LandedFacts(**(base | kw))  # type: ignore[arg-type]


def big_batches(f: LandedFacts) -> bool:
    """A predicate for the tests: fire on batches averaging at least 100 steps."""
    return f.batches > 0 and f.steps / f.batches >= 100


def test_default_learner_trigger_is_a_train_batch_of_steps() -> None:
    t = LearnerTrigger()
    assert not t.fires(facts(batches=3, steps=511, actors=2), train_batch_size=512)
    assert t.fires(facts(batches=3, steps=512, actors=2), train_batch_size=512)
    assert t.batches_short(3) == 1  # claims one batch at a time, as rounds were formed before triggers


def test_batches_alone_drop_the_step_condition() -> None:
    t = LearnerTrigger(batches=2)
    assert t.held(facts(batches=1, steps=4000), train_batch_size=512) == {"landed": True, "batches": False}
    assert t.fires(facts(batches=2, steps=10), train_batch_size=512)
    assert t.batches_short(0) == 2 and t.batches_short(1) == 1 and t.batches_short(5) == 1


def test_every_set_condition_must_hold() -> None:
    t = LearnerTrigger(batches=2, steps=300, version_changed=True, period_s=2.0)
    ok = facts(batches=2, steps=300, version=6, fired_version=5, since_fire_s=2.0)
    assert t.held(ok, train_batch_size=512) == {
        "landed": True,
        "batches": True,
        "steps": True,
        "version_changed": True,
        "period_s": True,
    }
    assert t.fires(ok, train_batch_size=512)
    for broken in (
        {"batches": 1},
        {"steps": 299},
        {"version": 5},  # same version as at the last firing
        {"since_fire_s": 1.99},
    ):
        assert not t.fires(facts(**(ok.__dict__ | broken)), train_batch_size=512), broken


def test_first_firing_counts_as_a_version_change_and_a_period() -> None:
    t = LearnerTrigger(version_changed=True, period_s=30.0, batches=1)
    assert t.fires(facts(batches=1, steps=8, fired_version=None), train_batch_size=512)


def test_nothing_fires_without_a_batch() -> None:
    assert not LearnerTrigger(period_s=1.0, steps=1).fires(facts(since_fire_s=5.0), train_batch_size=512)


def test_predicate_sees_the_facts() -> None:
    t = LearnerTrigger(batches=1, predicate="tests.stellaris.test_triggers:big_batches")
    assert t.needs_version
    assert t.fires(facts(batches=2, steps=200), train_batch_size=512)
    assert not t.fires(facts(batches=2, steps=199), train_batch_size=512)


@pytest.mark.parametrize(
    ("queued", "in_flight", "owed", "since", "seen"),
    [
        (5, 3, 0, math.inf, 5),  # K=1: the whole queue, as without triggers
        (0, 3, 0, math.inf, 0),
    ],
)
def test_default_parameter_trigger_shows_the_whole_queue(
    queued: int, in_flight: int, owed: int, since: float, seen: int
) -> None:
    assert ParameterTrigger().visible(queued=queued, in_flight=in_flight, owed=owed, since_fire_s=since) == seen


def test_parameter_trigger_groups_of_k() -> None:
    t = ParameterTrigger(gradients=4)
    assert t.visible(queued=3, in_flight=2, owed=0, since_fire_s=math.inf) == 0  # a group is not full yet
    assert t.visible(queued=4, in_flight=2, owed=0, since_fire_s=math.inf) == 4
    assert t.visible(queued=9, in_flight=2, owed=0, since_fire_s=math.inf) == 8  # two whole groups, one waits
    # A rule that applies one at a time (async) works through the fired group before the next firing:
    assert t.visible(queued=3, in_flight=2, owed=3, since_fire_s=0.0) == 3
    # Nothing left in flight: nothing more can land, so the remainder goes (liveness at the round's end).
    assert t.visible(queued=3, in_flight=0, owed=0, since_fire_s=0.0) == 3


def test_parameter_trigger_period() -> None:
    t = ParameterTrigger(gradients=2, period_s=10.0)
    assert t.visible(queued=4, in_flight=1, owed=0, since_fire_s=9.5) == 0
    assert t.wait_s(9.5) == pytest.approx(0.5)
    assert t.visible(queued=4, in_flight=1, owed=0, since_fire_s=10.0) == 4
    assert t.visible(queued=4, in_flight=1, owed=2, since_fire_s=1.0) == 2  # an owed group is not held back
    assert t.wait_s(math.inf) == 0.0 and ParameterTrigger().wait_s(3.0) == 0.0


def test_parameter_rows_group_by_version() -> None:
    rows = [
        {"gradient_id": "1-0", "round": 1, "applied_version": 1},
        {"gradient_id": "2-0", "round": 1, "applied_version": 1},
        {"gradient_id": "3-0", "round": 2, "applied_version": 2},
    ]
    got = parameter_rows(rows)
    assert [(r["round"], r["count"], r["claimed"]) for r in got] == [(1, 2, '["1-0", "2-0"]'), (2, 1, '["3-0"]')]


def test_config_takes_yaml_mapping_and_json_flag() -> None:
    triggers = {"learner": {"batches": 2}, "parameter": {"gradients": 4}}
    cfg = load_config(None, {**CARTPOLE, "actors": 2, "triggers": triggers})
    assert cfg.triggers.learner.batches == 2 and cfg.triggers.parameter.gradients == 4
    assert cfg.job_request("j").parameter_trigger.model_dump() == {"gradients": 4, "period_s": None}
    flag = load_config(None, {**CARTPOLE, "triggers": '{"learner": {"steps": 64, "period_s": 0.5}}'})
    assert flag.triggers.learner.steps == 64 and flag.triggers.parameter == ParameterTrigger()


def test_default_config_has_default_triggers() -> None:
    cfg = load_config(None, CARTPOLE)
    assert cfg.triggers.learner == LearnerTrigger() and cfg.triggers.parameter == ParameterTrigger()


@pytest.mark.parametrize(
    ("triggers", "named"),
    [
        ({"learner": {"batches": 0}}, "triggers.learner.batches"),
        ({"learner": {"period_s": -1}}, "triggers.learner.period_s"),
        ({"learner": {"predicate": "no_such_module_xyz:f"}}, "triggers.learner.predicate"),
        ({"learner": {"predicate": "math"}}, "triggers.learner.predicate"),
        ({"learner": {"predicate": "math:no_such"}}, "triggers.learner.predicate"),
        ({"learner": {"batchez": 2}}, "triggers.learner.batchez"),
        ({"parameter": {"gradients": 0}}, "triggers.parameter.gradients"),
        ({"parameter": {"period_s": 0}}, "triggers.parameter.period_s"),
        ('{"learner": ', "triggers"),
    ],
)
def test_bad_triggers_name_the_field(triggers: object, named: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid configuration: {named}"):
        load_config(None, {**CARTPOLE, "triggers": triggers})


def test_a_batch_count_beyond_the_queue_bound_is_refused_naming_the_bound() -> None:
    two = {"learner": {"batches": 2}}
    with pytest.raises(ConfigError, match=r"triggers\.learner\.batches: 2 exceeds the trajectory queue's bound 1 "):
        load_config(None, {**CARTPOLE, "triggers": two})  # 1 actor x the default run-ahead, 1
    cfg = load_config(None, {**CARTPOLE, "actor_run_ahead": 2, "triggers": two})
    assert cfg.triggers.learner.batches == 2 and cfg.queue_bound == 2


def test_the_gate_s_last_firing_survives_a_checkpoint(job: JobCache) -> None:
    trigger = LearnerTrigger(version_changed=True, period_s=30.0)
    fresh = LearnerGate(trigger, job)
    assert fresh.state() == {"fired_version": None, "since_fire_s": None}
    fresh.fired_at, fresh.fired_version = time.monotonic() - 12.0, 7
    saved = json.loads(json.dumps(fresh.state()))  # through state.json
    assert saved["fired_version"] == 7 and 12.0 <= saved["since_fire_s"] < 13.0
    resumed = LearnerGate(trigger, job, saved)
    facts = resumed.facts(5, [], version=7)
    # Still at version 7, 12 s after the firing: neither condition holds, as in the run that died.
    assert facts.fired_version == 7 and 12.0 <= facts.since_fire_s < 14.0
    held = resumed.trigger.held(facts, train_batch_size=64)
    assert (held["version_changed"], held["period_s"]) == (False, False)
    assert resumed.trigger.held(replace(facts, version=8), train_batch_size=64)["version_changed"]
    assert math.isinf(LearnerGate(trigger, job, {}).facts(5, [], version=7).since_fire_s)
