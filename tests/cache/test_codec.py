import pickle
import struct

import msgpack
import numpy as np
import pytest
import torch

from contract.codec import MAGIC, CodecError, decode, encode, encode_parts

rng = np.random.default_rng(0)


def _message(header: object, data: bytes = b"") -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<4sI", MAGIC, len(h)) + h + data


@pytest.mark.parametrize(
    "arr",
    [
        rng.standard_normal((5, 3)).astype(np.float32),
        rng.standard_normal(7),
        rng.integers(0, 255, (2, 3, 84, 84), dtype=np.uint8),
        rng.integers(-5, 5, (4,), dtype=np.int64),
        np.array([True, False, True]),
        np.zeros((0, 4), np.float32),
        np.float32(3.5).reshape(()),
        rng.standard_normal((3, 2)).astype(np.float16),
        rng.integers(0, 9, (6,), dtype=np.int8),
    ],
)
def test_round_trip_preserves_dtype_shape_and_values(arr: np.ndarray) -> None:
    frame = decode(encode({"x": arr, "pad": np.ones(3, np.uint8)}, {"v": 7, "ids": ["a", "b"]}))
    assert frame.meta == {"v": 7, "ids": ["a", "b"]}
    assert frame.arrays["x"].dtype == arr.dtype
    assert frame.arrays["x"].shape == arr.shape
    np.testing.assert_array_equal(frame.arrays["x"], arr)


def test_torch_tensors_round_trip_including_bfloat16() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(4, 5, generator=g),
        "b": torch.randn(5, generator=g).to(torch.bfloat16),
        "t": torch.randn(3, 4, generator=g).t(),  # non-contiguous
    }
    out = decode(encode(tensors)).tensors()
    for k, t in tensors.items():
        assert out[k].dtype == t.dtype
        assert torch.equal(out[k], t)


def test_big_endian_input_is_stored_little_endian() -> None:
    arr = np.arange(6, dtype=">i4")
    np.testing.assert_array_equal(decode(encode({"a": arr})).arrays["a"], arr)


def test_decode_is_zero_copy() -> None:
    buf = encode({"a": np.arange(1000, dtype=np.float32)})
    arr = decode(buf).arrays["a"]
    assert not arr.flags.writeable
    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert isinstance(base, memoryview) and base.obj is buf


def test_offsets_are_aligned_and_parts_concatenate_to_message() -> None:
    parts = encode_parts({"a": np.ones(3, np.uint8), "b": np.ones(2, np.float64)})
    frame = decode(b"".join(bytes(p) for p in parts))
    assert frame.arrays["b"].ctypes.data % 8 == (frame.arrays["a"].ctypes.data % 8)


def test_encode_rejects_unsupported_inputs() -> None:
    with pytest.raises(CodecError, match="complex"):
        encode({"z": np.ones(2, np.complex64)})
    with pytest.raises(CodecError, match="expected a numpy array"):
        encode({"l": [1, 2, 3]})
    with pytest.raises(CodecError, match="name"):
        encode({"": np.ones(1)})
    with pytest.raises(CodecError, match="msgpack"):
        encode({"a": np.ones(1)}, {"bad": object()})


def test_pickle_payload_is_rejected_not_executed() -> None:
    class Boom:
        def __reduce__(self):  # would run on unpickling
            return (exec, ("raise SystemExit('pwned')",))

    with pytest.raises(CodecError, match="bad magic"):
        decode(pickle.dumps(Boom()))


GOOD = encode({"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 2), np.uint8)}, {"k": 1})


@pytest.mark.parametrize(
    ("buf", "match"),
    [
        (b"", "truncated message"),
        (b"ST", "truncated message"),
        (b"XXXX" + GOOD[4:], "bad magic"),
        (GOOD[:10], "truncated message: header"),
        (GOOD[:-1], "truncated message: header says"),
        (GOOD + b"\0", "trailing bytes"),
        (struct.pack("<4sI", MAGIC, 2**31), "header length"),
        (struct.pack("<4sI", MAGIC, 3) + b"\xc1\xc1\xc1", "corrupt header"),
        (_message([1, 2]), "expected a map"),
        (_message({"meta": {}, "arrays": {}, "size": 0}), "'arrays' a list"),
        (_message({"meta": {}, "arrays": [["a", "float32", [2], 0]], "size": 8}, b"\0" * 8), r"spec #0"),
        (_message({"meta": {}, "arrays": [["a", "object", [1], 0, 8]], "size": 8}, b"\0" * 8), "unknown dtype"),
        (_message({"meta": {}, "arrays": [["a", "float32", [3], 0, 8]], "size": 8}, b"\0" * 8), "header says 8"),
        (_message({"meta": {}, "arrays": [["a", "float32", [4], 0, 16]], "size": 8}, b"\0" * 8), "run past"),
        (_message({"meta": {}, "arrays": [["a", "float32", [-1], 0, 0]], "size": 0}), "shape"),
        (_message({"meta": {}, "arrays": [["a", "uint8", [1], 3, 1]], "size": 8}, b"\0" * 8), "aligned"),
        (
            _message(
                {"meta": {}, "arrays": [["a", "float32", [2], 0, 8], ["a", "uint8", [1], 8, 1]], "size": 9}, b"\0" * 9
            ),
            "twice",
        ),
        (
            _message(
                {"meta": {}, "arrays": [["a", "float32", [2], 0, 8], ["b", "float32", [1], 0, 4]], "size": 8}, b"\0" * 8
            ),
            "overlaps",
        ),
        (_message({"meta": {}, "arrays": [[1, "uint8", [1], 0, 1]], "size": 1}, b"\0"), "name"),
        (_message({"meta": {}, "arrays": [["a", "uint8", [True], 0, 1]], "size": 1}, b"\0"), "shape"),
    ],
)
def test_malformed_inputs_raise_codec_error_naming_the_problem(buf: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        decode(buf)


def test_oversized_message_is_refused_before_parsing() -> None:
    with pytest.raises(CodecError, match="exceeds the limit"):
        decode(GOOD, max_bytes=len(GOOD) - 1)
    assert decode(GOOD, max_bytes=len(GOOD)).meta == {"k": 1}


def test_non_bytes_input_is_refused() -> None:
    with pytest.raises(CodecError, match="expected bytes"):
        decode("text")  # type: ignore[arg-type]


def test_random_corruption_only_ever_raises_codec_error() -> None:
    r = np.random.default_rng(1)
    for _ in range(2000):
        buf = bytearray(GOOD)
        for pos in r.integers(0, len(buf), size=r.integers(1, 4)):
            buf[pos] = int(r.integers(0, 256))
        cut = int(r.integers(0, len(buf) + 1))
        try:
            frame = decode(bytes(buf[:cut]))
        except CodecError:
            continue
        # A mutation that still decodes must describe a self-consistent frame.
        for arr in frame.arrays.values():
            assert isinstance(arr, np.ndarray)
