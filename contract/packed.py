"""Parameters packed end to end in one array, with their names and shapes in the frame's meta.

A policy frame or a gradient of a flat policy (``functions.model.flat_params``) carries all parameters as the one array
``params`` and, in its meta, ``layout``: ``[[name, shape], ...]`` in packing order. One buffer to encode, send and
copy replaces one per tensor: the fast preset's policy has 13 parameter tensors, and per-tensor work was most of
what a publish, a weight load and a gradient's encoding cost. Readers that want the tensors by name (the policy
file, a load into a policy of another layout) unpack them here, as views of the packed buffer. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from contract.errors import CodecError

PACKED = "params"
LAYOUT = "layout"

Layout = tuple[tuple[str, tuple[int, ...]], ...]


def wire_layout(layout: Layout) -> list[list[Any]]:
    """The layout as the meta carries it (msgpack has no tuples)."""
    return [[name, list(shape)] for name, shape in layout]


def read_layout(meta: Mapping[str, Any], size: int) -> Layout:
    """The meta's layout, checked against the packed array's `size` (elements); `CodecError` names what is wrong."""
    raw = meta.get(LAYOUT)
    if not isinstance(raw, list) or not raw:
        raise CodecError(f"packed {PACKED!r} needs a non-empty {LAYOUT!r} list in the meta, got {raw!r}")
    layout: list[tuple[str, tuple[int, ...]]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0]
        shape = item[1] if ok else None
        if not ok or not isinstance(shape, list) or not all(_dim(d) for d in shape):
            raise CodecError(f"{LAYOUT} entry #{i} must be [name, [non-negative ints]], got {item!r}")
        if item[0] in seen:
            raise CodecError(f"{LAYOUT}: parameter {item[0]!r} appears twice")
        seen.add(item[0])
        layout.append((item[0], tuple(shape)))
    total = sum(math.prod(shape) for _, shape in layout)
    if total != size:
        raise CodecError(f"{LAYOUT} describes {total} elements but {PACKED!r} holds {size}")
    return tuple(layout)


def _dim(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0


def split(flat: Any, layout: Sequence[tuple[str, tuple[int, ...]]]) -> dict[str, Any]:
    """Named views of a 1-d packed array (numpy or torch), in layout order."""
    out: dict[str, Any] = {}
    offset = 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return out


def unpacked(meta: Mapping[str, Any], arrays: Mapping[str, Any]) -> dict[str, Any]:
    """A frame's arrays (numpy, or torch tensors) by name: the packed array, when there is one, replaced by views
    of its parameters."""
    flat = arrays.get(PACKED)
    if flat is None:
        return dict(arrays)
    if flat.ndim != 1:
        raise CodecError(f"packed {PACKED!r} must be 1-d, got shape {tuple(flat.shape)}")
    named = split(flat, read_layout(meta, flat.shape[0]))
    clash = sorted(named.keys() & arrays.keys())
    if clash:
        raise CodecError(f"packed parameters {clash} also travel as arrays of their own")
    return {**{k: v for k, v in arrays.items() if k != PACKED}, **named}
