"""Which landed trajectory batches make a round: pure choices over batch headers, no I/O."""

from __future__ import annotations

import re

from cache import BatchMeta

Landed = tuple[str, BatchMeta]  # (batch id, header)


def actor_order(actor_id: str) -> list[int | str]:
    """A natural sort key: actor-2 before actor-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", actor_id)]


def actors_in(batches: list[Landed]) -> int:
    return len({meta.actor_id for _, meta in batches})


def first_of_each(batches: list[Landed]) -> tuple[list[Landed], list[Landed]]:
    """Each actor's first batch, in actor order, and the others in arrival order. Round 1 is made of these: every
    first batch is collected under the initial policy from the seeded envs and sampler, so the same seed gives the
    same round 1 whichever actor happened to land a second batch before another landed its first."""
    first: dict[str, Landed] = {}
    rest: list[Landed] = []
    for landed in batches:
        if landed[1].actor_id in first:
            rest.append(landed)
        else:
            first[landed[1].actor_id] = landed
    return [first[a] for a in sorted(first, key=actor_order)], rest
