"""Where the process backend pins its instances (gateway/backends/process/core_placement.py), by hand-worked cases."""

from __future__ import annotations

from gateway.backends.process.core_placement import CorePlacement


def test_instances_are_pinned_at_their_first_call_and_spares_hold_no_core() -> None:
    p = CorePlacement([0, 1])
    for instance in ("param", "spare-param", "l1", "l2", "spare-l"):  # started in this order; none pinned yet
        p.add(instance, 1)
    # Called in this order: each takes the core the fewest pinned instances use (the lower on a tie). The spares,
    # never called, take no core's share, so the called ones spread as if they had been started alone.
    assert [p.first_call(i) for i in ("param", "l1", "l2")] == [[0], [1], [0]]
    assert p.first_call("l1") is None  # pinned already: it stays where it is
    p.forget("l1")  # killed: its core's share is freed
    assert p.first_call("spare-l") == [1]  # its replacement call lands on a spare, which takes the dead one's core
    assert p.first_call("gone") is None  # an instance it does not know (discovered, or already stopped)
    p.forget("spare-param")  # never called: nothing to free, nothing left behind
    assert p.cores == {"param": [0], "l2": [0], "spare-l": [1]} and p.wants == {}


def test_whole_cores_go_to_the_least_pinned_first() -> None:
    p = CorePlacement([5, 2, 3])
    for instance, want in (("a", 1), ("b", 2), ("c", 1)):
        p.add(instance, want)
    assert p.first_call("a") == [2]
    assert p.first_call("b") == [3, 5]  # the two cores nothing is pinned to
    assert p.first_call("c") == [2]  # every core has one: the lowest


def test_an_instance_wanting_every_core_is_never_pinned() -> None:
    p = CorePlacement([0, 1])
    p.add("big", 2)
    assert p.first_call("big") is None
    assert p.cores == {} and p.wants == {}
