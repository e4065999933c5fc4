"""What the ray backend decides from Ray's node list alone, without Ray, so it is unit-tested:

- whether the instances can reach the cache: a Redis on loopback serves only its own machine, so a cluster with
  nodes on other machines needs a REDIS_URL that every node can reach (`refuse_loopback_cache`);
- why an instance was not placed in time: no node has that much of every resource asked for, or the nodes that
  have it are busy (`unplaced_reason`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from gateway.backends.base import BackendError
from gateway.settings import resolves_to_loopback


def is_local_address(address: str) -> bool:
    """Whether `address` (an IP literal) is one of this machine's: loopback, or an address a socket can bind here."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return resolves_to_loopback(address)
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
    except OSError:
        return False
    return True


def redis_location(redis_url: str) -> tuple[str, bool]:
    """(the URL without its credentials, for messages; whether it serves only this machine: a unix socket, or a host
    that resolves to loopback only)."""
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}", True
    host = parts.hostname or "localhost"
    shown = f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}"
    return shown, resolves_to_loopback(host)


def refuse_loopback_cache(
    redis_url: str | None, node_addresses: Iterable[str], *, is_local: Callable[[str], bool] = is_local_address
) -> None:
    """Raise BackendError when the instances would get a loopback-only REDIS_URL while some Ray node is on another
    machine (an address that is neither loopback nor this machine's). None: the instances get no REDIS_URL."""
    if redis_url is None:
        return
    shown, loopback_only = redis_location(redis_url)
    if not loopback_only:
        return
    remote = sorted({a for a in node_addresses if not is_local(a)})
    if remote:
        raise BackendError(
            f"REDIS_URL {shown} listens on loopback, but Ray nodes {', '.join(remote)} are on other machines: "
            "give REDIS_URL a Redis every node can reach"
        )


def unplaced_reason(asked: Mapping[str, float], nodes: Iterable[Mapping[str, Any]], timeout_s: float) -> str:
    """Why an actor asking for `asked` did not serve within `timeout_s`, given `ray.nodes()`: no alive node has that
    much of every resource, or some do but are busy (or the instance is slow to start)."""
    wanted = _resources(asked, ordered=False)
    alive = [n for n in nodes if n.get("Alive")]
    fits = [n["NodeManagerAddress"] for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in asked.items())]
    offered = "; ".join(
        f"{n['NodeManagerAddress']} ({_resources(dict(sorted(n['Resources'].items())))})" for n in alive
    )
    if fits:
        why = f"not serving with {{{wanted}}} (nodes {', '.join(fits)} have that much, but may be busy)"
    else:
        why = f"no Ray node has {{{wanted}}}"
    return f"{why} within {timeout_s:g} s; alive nodes: {offered or 'none'}"


def _resources(amounts: Mapping[str, float], *, ordered: bool = True) -> str:
    """`CPU: 2, GPU: 0.25, gpu_node: 1` (sorted unless `ordered` is False), without Ray's own bookkeeping resources
    (node:<ip>, memory, object_store_memory)."""
    shown = [(k, v) for k, v in amounts.items() if not k.startswith("node:") and k not in _BOOKKEEPING]
    return ", ".join(f"{k}: {v:g}" for k, v in (sorted(shown) if ordered else shown))


_BOOKKEEPING = ("memory", "object_store_memory")
