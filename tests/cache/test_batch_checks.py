"""The pure checks of a trajectory batch read from the cache (contract/batch_checks.py), on hand-made entries."""

from __future__ import annotations

import numpy as np

from contract.batch_checks import checked_batch, nonfinite, version_ahead
from contract.codec import HEADER_FIELD, encode_fields
from contract.records import TRAJECTORY_ARRAYS, BatchMeta, TrajectoryBatch


def _fields(flat: list[bytes | memoryview]) -> dict[bytes, bytes]:
    return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}


def _batch(version: int = 2, **arrays: np.ndarray) -> TrajectoryBatch:
    base = {k: np.zeros((3, 2), np.float32) for k in TRAJECTORY_ARRAYS}
    return TrajectoryBatch("actor-0", version, 6, {**base, **arrays}, {"episode_returns": [1.0]})


def test_a_version_ahead_of_the_published_one_is_impossible() -> None:
    assert version_ahead(3, 3, "v") is None and version_ahead(0, 7, "v") is None
    assert version_ahead(10**9, None, "v") is None  # nothing published known: nothing judged
    assert version_ahead(4, 3, "behaviour version") == (
        "behaviour version 4 is ahead of the newest published policy version 3"
    )


def test_non_finite_names_only_floating_arrays_holding_nan_or_infinity() -> None:
    arrays = {
        "ok": np.array([1.0, -2.5], np.float32),
        "nan": np.array([[0.0, np.nan]], np.float64),
        "ints": np.array([1, 2], np.int64),
        "inf": np.array([-np.inf], np.float16),
        "flags": np.array([True, False]),
    }
    assert nonfinite(arrays) == ["nan", "inf"]
    assert nonfinite({}) == []


def test_a_whole_batch_passes_with_its_header() -> None:
    got = checked_batch(_fields(_batch().fields()), payloads=True, published=2)
    assert got == BatchMeta("actor-0", 2, 6, {"episode_returns": [1.0]})


def test_each_poison_is_named() -> None:
    whole = _fields(_batch().fields())
    assert "corrupt header" in str(checked_batch({HEADER_FIELD: b"\xc1"}, payloads=False, published=None))
    assert "no header field" in str(checked_batch({b"a0": b""}, payloads=False, published=None))
    assert "is ahead of the newest published policy version 1" in str(checked_batch(whole, payloads=True, published=1))
    header_only = {HEADER_FIELD: whole[HEADER_FIELD]}
    assert checked_batch(header_only, payloads=False, published=2) == BatchMeta(
        "actor-0", 2, 6, {"episode_returns": [1.0]}
    )  # gradients_at_actors: a header is the whole batch
    assert "field a0 is missing" in str(checked_batch(header_only, payloads=True, published=2))
    cut = {**whole, b"a1": whole[b"a1"][:-4]}
    assert "header says 24 bytes but the field has 20" in str(checked_batch(cut, payloads=True, published=2))
    bare = _fields(encode_fields({}, BatchMeta("actor-0", 0, 6, {}).to_dict()))
    assert "lacks arrays" in str(checked_batch(bare, payloads=True, published=None))
    short = _fields(
        encode_fields(
            {k: np.zeros((3 if k != "values" else 2, 2), np.float32) for k in TRAJECTORY_ARRAYS},
            BatchMeta("actor-0", 0, 6, {}).to_dict(),
        )
    )
    assert "arrays disagree on length" in str(checked_batch(short, payloads=True, published=None))
    nan = _fields(_batch(values=np.array([[0.0, 1.0], [np.nan, 0.0], [0.0, 0.0]], np.float32)).fields())
    assert (
        checked_batch(nan, payloads=True, published=2) == "trajectory batch from 'actor-0': non-finite values in values"
    )
    assert isinstance(checked_batch(nan, payloads=False, published=2), BatchMeta)  # arrays unread: not judged
