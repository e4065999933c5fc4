"""Whether a trajectory batch read from the cache can be trained on: pure checks of what was read (no I/O), so that a
poisoned entry is dead-lettered where it is read instead of ending the run or costing a round's other batches.

A batch is poisoned when its header cannot be decoded, when it says it was collected with a policy version newer than
the newest published one (no actor can have held that version), or, where batches carry their arrays (the
`trajectories` distribution profile; under `gradients_at_actors` a header alone is the whole entry), when its arrays
are missing or cut short (a header-only batch), disagree on their length, or hold non-finite values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from contract.codec import DEFAULT_MAX_BYTES
from contract.errors import CodecError, RecordError
from contract.records import BatchMeta, TrajectoryBatch


def version_ahead(version: int, published: int | None, what: str) -> str | None:
    """Why `version` is impossible for an entry made against the policy store whose newest version is `published`
    (None: not known, nothing is judged): no one can have held a version that was never published."""
    if published is None or version <= published:
        return None
    return f"{what} {version} is ahead of the newest published policy version {published}"


def nonfinite(arrays: Mapping[str, Any]) -> list[str]:
    """The names of the floating-point arrays holding a NaN or an infinity, in order (integer arrays never do)."""
    bad = []
    for name, value in arrays.items():
        arr = np.asarray(value)
        if np.issubdtype(arr.dtype, np.floating) and not bool(np.isfinite(arr).all()):
            bad.append(name)
    return bad


def checked_batch(
    fields: Mapping[bytes, bytes], *, payloads: bool, published: int | None, max_bytes: int = DEFAULT_MAX_BYTES
) -> BatchMeta | str:
    """The batch's header when the entry `fields` can be trained on, else why not (a reason to dead-letter it with).
    `payloads`: the entry must carry its arrays; `published`: the newest published policy version (None: unknown)."""
    try:
        meta = BatchMeta.from_fields(fields)
    except (CodecError, RecordError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if (ahead := version_ahead(meta.behaviour_version, published, "trajectory batch: behaviour version")) is not None:
        return ahead
    if not payloads:
        return meta
    try:
        batch = TrajectoryBatch.from_fields(fields, max_bytes=max_bytes)
    except (CodecError, RecordError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if bad := nonfinite(batch.arrays):
        return f"trajectory batch from {meta.actor_id!r}: non-finite values in {', '.join(bad)}"
    return meta
