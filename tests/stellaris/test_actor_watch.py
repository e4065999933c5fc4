"""The hung-actor rule (stellaris/platform/actor_watch.py) against hand-worked timelines."""

from __future__ import annotations

from stellaris.platform.actor_watch import LOOK_GAP_S, ActorWatch


def test_an_actor_whose_count_stands_still_for_hung_after_s_of_looking_is_hung() -> None:
    watch = ActorWatch(hung_after_s=10.0)
    assert watch.hung({"actor-0": 5, "actor-1": 7}, now=100.0) == []  # first look: clocks start
    t = 100.0
    for step in range(1, 10):  # actor-0 beats, actor-1 stands still at 7; a look a second
        t = 100.0 + step
        assert watch.hung({"actor-0": 5 + step, "actor-1": 7}, now=t) == []
    assert watch.silent_s("actor-1", 109.0) == 9.0
    assert watch.hung({"actor-0": 15, "actor-1": 7}, now=110.0) == ["actor-1"]  # 10 s since 100.0
    assert watch.silent_s("actor-0", 110.0) == 0.0


def test_time_not_spent_looking_does_not_count() -> None:
    """Looks 1 s apart, then a gap (between rounds, or a Redis stall that held the beats and the read alike)."""
    watch = ActorWatch(hung_after_s=10.0)
    for t in (0.0, 1.0, 2.0):
        assert watch.hung({"actor-0": 3}, now=t) == []
    gap_end = 2.0 + LOOK_GAP_S + 0.5
    assert watch.hung({"actor-0": 3}, now=gap_end) == []  # 5.5 s unchanged, but the clock started again here
    assert watch.silent_s("actor-0", gap_end) == 0.0
    t = gap_end
    for _ in range(9):
        t += 1.0
        assert watch.hung({"actor-0": 3}, now=t) == []
    assert watch.hung({"actor-0": 3}, now=t + 1.0) == ["actor-0"]  # 10 s of looking since gap_end


def test_a_restarted_actor_starts_afresh_and_one_without_a_count_is_not_judged() -> None:
    watch = ActorWatch(hung_after_s=2.0)
    assert watch.hung({"actor-0": 1}, now=0.0) == []
    assert watch.hung({"actor-0": 1}, now=1.0) == []
    assert watch.hung({"actor-0": 1}, now=2.0) == ["actor-0"]
    watch.forget("actor-0")  # killed and started again; its field cleared: no count until it beats
    assert watch.hung({}, now=3.0) == []
    assert watch.hung({"actor-0": 1}, now=4.0) == []  # its first beat (a field started anew)
    assert watch.hung({"actor-0": 2}, now=5.0) == []
    assert watch.hung({"actor-0": 2}, now=6.0) == []
    assert watch.hung({"actor-0": 2}, now=7.0) == ["actor-0"]


def test_zero_turns_the_watch_off() -> None:
    watch = ActorWatch(hung_after_s=0.0)
    assert watch.hung({"actor-0": 1}, now=0.0) == [] and watch.hung({"actor-0": 1}, now=1e6) == []
