"""The order in which a pool reuses idle instances, with and without an affinity key (pure: no instances run)."""

import pytest

from gateway.backends.base import InstanceHandle
from gateway.instances import MAX_AFFINITY_KEY_CHARS, Live, affinity_key, reuse_order


def live(name: str, idle_since: float, affinity: str | None = None) -> Live:
    return Live(InstanceHandle(name, "f", "http://127.0.0.1:1", "process"), idle_since=idle_since, affinity=affinity)


def names(order: list[Live]) -> list[str]:
    return [x.handle.id for x in order]


def test_without_a_key_the_most_recently_used_come_first_unclaimed_ones_before_claimed() -> None:
    pool = [live("old", 1.0), live("new", 3.0), live("claimed", 5.0, "actor-0")]
    assert names(reuse_order(pool, None)) == ["new", "old", "claimed"]


def test_a_key_takes_its_own_instance_first_then_an_unclaimed_one_then_another_keys() -> None:
    pool = [live("a", 1.0, "actor-0"), live("b", 4.0, "actor-1"), live("free", 2.0)]
    assert names(reuse_order(pool, "actor-0")) == ["a", "free", "b"]
    assert names(reuse_order(pool, "actor-1")) == ["b", "free", "a"]
    assert names(reuse_order(pool, "actor-2")) == ["free", "b", "a"]


def test_the_header_value_is_checked() -> None:
    assert affinity_key(None) is None and affinity_key("") is None
    assert affinity_key("actor-3") == "actor-3"
    with pytest.raises(ValueError, match=f"at most {MAX_AFFINITY_KEY_CHARS}"):
        affinity_key("x" * (MAX_AFFINITY_KEY_CHARS + 1))
