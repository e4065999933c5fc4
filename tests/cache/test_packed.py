"""Packed parameters in a frame: named views of the one array, and every bad layout named."""

import numpy as np
import pytest

from contract.codec import decode, encode
from contract.errors import CodecError
from contract.packed import LAYOUT, PACKED, unpacked, wire_layout

LAYOUT_2 = (("a.weight", (2, 3)), ("a.bias", (2,)))


def test_packed_parameters_unpack_into_views_beside_the_other_arrays() -> None:
    flat = np.arange(8, dtype=np.float32)
    frame = decode(encode({PACKED: flat, "norm.mean": np.ones(3)}, {LAYOUT: wire_layout(LAYOUT_2)}))
    named = unpacked(frame.meta, frame.arrays)
    assert list(named) == ["norm.mean", "a.weight", "a.bias"]
    np.testing.assert_array_equal(named["a.weight"], [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(named["a.bias"], [6, 7])
    assert named["a.bias"].base is not None  # a view of the received buffer, not a copy


def test_a_frame_without_packed_parameters_is_returned_as_it_is() -> None:
    arrays = {"w": np.zeros(2)}
    assert unpacked({}, arrays) == arrays


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (None, "needs a non-empty 'layout'"),
        ([["a.weight", [2, 3]]], "describes 6 elements but 'params' holds 8"),
        ([["a.weight", [2, 3]], ["a.weight", [2]]], "'a.weight' appears twice"),
        ([["a.weight", [2, -3]], ["a.bias", [14]]], "entry #0 must be"),
        ([["", [8]]], "entry #0 must be"),
        ([["a", [True, 8]]], "entry #0 must be"),
        ([["norm.mean", [8]]], "also travel as arrays of their own"),
    ],
)
def test_a_bad_layout_is_refused_naming_what_is_wrong(layout: object, message: str) -> None:
    meta = {} if layout is None else {LAYOUT: layout}
    arrays = {PACKED: np.zeros(8, np.float32), "norm.mean": np.ones(3)}
    with pytest.raises(CodecError, match=message):
        unpacked(meta, arrays)


def test_packed_parameters_must_be_one_dimensional() -> None:
    with pytest.raises(CodecError, match="must be 1-d"):
        unpacked({LAYOUT: wire_layout(LAYOUT_2)}, {PACKED: np.zeros((2, 4), np.float32)})
