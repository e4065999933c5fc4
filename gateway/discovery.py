"""After a gateway restart: the instances that survived it (containers, and the actors of a given Ray cluster; process
instances and a private Ray's actors die with the gateway) go back to their own functions' pools, keyed by the
function and spec each was started for. What no pool takes is
stopped: an instance of a function no longer registered, of a replaced spec, or beyond max_instances would
otherwise run (and hold its CPUs, memory and GPUs) with nothing ever sending it a call."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.backends.base import Backend, InstanceHandle
from gateway.pool import FunctionPool

log = logging.getLogger("stellaris.gateway.discovery")


@dataclass
class Survivors:
    """What a restarted gateway did with the instances it found, by function."""

    adopted: dict[str, list[InstanceHandle]] = field(default_factory=dict)
    stopped: list[InstanceHandle] = field(default_factory=list)
    left: list[InstanceHandle] = field(default_factory=list)  # of a function registered meanwhile: not ours


async def discover(backends: Mapping[str, Backend]) -> list[InstanceHandle]:
    """Every surviving instance on these backends (each asked once, whatever its number of functions)."""
    found = await asyncio.gather(*(asyncio.to_thread(b.discover) for b in backends.values()))
    return [handle for handles in found for handle in handles]


def sort_survivors(found: list[InstanceHandle], pools: Mapping[str, FunctionPool], registered: set[str]) -> Survivors:
    """Hand each instance to its own function's pool. `registered`: the registry's names, read after discovery,
    so that every instance found was started after its function's registration: one of a function that is in
    `registered` but has no pool here was registered since the pools were made, by another gateway process of
    this namespace, and is left to it."""
    by_function: dict[str, list[InstanceHandle]] = defaultdict(list)
    for handle in found:
        by_function[handle.function].append(handle)
    out = Survivors()
    for function, handles in sorted(by_function.items()):
        pool = pools.get(function)
        if pool is not None:
            refused = pool.adopt(handles)
            out.adopted[function] = [h for h in handles if h.id in pool.instances]
            out.stopped += refused
        elif function in registered:
            out.left += handles
        else:
            out.stopped += handles
    for function, handles in out.adopted.items():
        log.info("adopted %d instance(s) of %r: %s", len(handles), function, ", ".join(h.id for h in handles))
    for handle in out.stopped:
        log.info("stopping instance %s of %r: no pool of its function and spec takes it", handle.id, handle.function)
    return out
