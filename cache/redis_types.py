"""redis-py's types made precise once, here, rather than cast at every call.

redis-py types a reply for every client setting at once: a string as `bytes | str` (either `decode_responses`), a
stream reply as RESP2's list or RESP3's dict, a ZRANGE reply with or without scores. The cache's clients never
decode replies and speak RESP2, so these helpers read a reply as such clients get it. Its arguments are typed with
invariant mappings, so a `dict[str, str]` is widened (`hash_fields`) before it is passed as a hash's fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import redis
import redis.cluster
from redis.typing import (
    EncodableT,
    FieldT,
    StreamRangeResponse,
    XReadGroupResponse,
    XReadResponse,
    ZSetRangeResponse,
)

RedisClient = redis.Redis | redis.cluster.RedisCluster
# A live stream entry: its id and its field -> value map, both as the server holds them.
RawEntry = tuple[str, dict[bytes, bytes]]


def text(raw: bytes | str) -> str:
    """A string reply (a key, an id, a field), decoded."""
    return raw.decode() if isinstance(raw, bytes) else raw


def binary(raw: bytes | str) -> bytes:
    """A binary reply (GET, MGET): bytes, as a client that does not decode replies gets it."""
    if isinstance(raw, str):
        raise TypeError("a binary reply came back decoded: the cache's clients must not set decode_responses")
    return raw


def stream_entries(items: StreamRangeResponse | None) -> list[RawEntry]:
    """The live entries of an XRANGE, XREVRANGE or XAUTOCLAIM reply, or of one stream of an XREAD(GROUP) reply, in
    order; an entry deleted while it was pending (no fields) is left out."""
    return [(text(i), cast(dict[bytes, bytes], f)) for i, f in items or [] if i is not None and f]


def read_entries(reply: XReadResponse | XReadGroupResponse | None) -> list[RawEntry]:
    """The live entries of an XREAD or XREADGROUP reply, stream after stream (RESP2: a list of [stream, entries])."""
    if isinstance(reply, dict):
        raise TypeError("a RESP3 stream reply: the cache's clients speak RESP2")
    return [entry for _stream, items in reply or [] for entry in stream_entries(items)]


def members(reply: ZSetRangeResponse) -> list[str]:
    """The members of a ZRANGE reply without scores, decoded."""
    return [text(m) for m in cast(list[bytes | str], reply)]


def hash_fields(fields: Mapping[str, str]) -> dict[FieldT, EncodableT]:
    """`fields` as HSET's mapping takes them (its key type is invariant, so a `dict[str, str]` is not one)."""
    return dict(fields.items())
