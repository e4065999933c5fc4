"""The one wire format for arrays crossing Redis or HTTP: a msgpack header plus raw little-endian buffers.

Layout::

    b"STL1" | u32 header length (LE) | msgpack header | raw buffers, each starting at an 8-byte aligned offset

The header is ``{"meta": {...}, "arrays": [[name, dtype, shape, offset, nbytes], ...], "size": data bytes}``.
Nothing is ever unpickled: msgpack only builds dicts, lists, strings and numbers, and every array spec is checked
against the buffer (dtype allow-list, shape, byte length, bounds, no overlap, no trailing bytes) before a view is
made. Decoding is zero-copy: arrays are read-only ``numpy`` views into the received buffer.

msgpack + raw buffers was chosen over safetensors because the header carries typed metadata (ints, lists) next
to the arrays and encoding skips safetensors' JSON header build; `experiments/bench_cache.py` measures both.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from contract.errors import CodecError

if TYPE_CHECKING:
    import torch

MAGIC = b"STL1"
_PREFIX = struct.Struct("<4sI")
_ALIGN = 8
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024
MAX_NDIM = 8
MAX_NAME_CHARS = 256

# Wire dtype name -> numpy dtype. bfloat16 travels as its raw 16 bits and becomes a torch bfloat16 tensor.
_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype("bool"),
    "uint8": np.dtype("<u1"),
    "int8": np.dtype("<i1"),
    "int16": np.dtype("<i2"),
    "uint16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "uint32": np.dtype("<u4"),
    "int64": np.dtype("<i8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bfloat16": np.dtype("<u2"),
}
_NUMPY_TO_WIRE = {v.str: k for k, v in _DTYPES.items() if k != "bfloat16"}
_NUMPY_TO_WIRE["|b1"] = "bool"
_NUMPY_TO_WIRE["|u1"] = "uint8"
_NUMPY_TO_WIRE["|i1"] = "int8"


@dataclass(frozen=True)
class Frame:
    """A decoded message: metadata plus named read-only arrays (views into the received buffer)."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str] = field(default_factory=dict)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The arrays as torch tensors sharing memory with the buffer (bfloat16 restored)."""
        import torch

        out: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():
            # The buffer is immutable bytes; consumers treat these tensors as read-only inputs.
            warnings.simplefilter("ignore", UserWarning)
            for name, arr in self.arrays.items():
                t = torch.from_numpy(arr)
                if self.dtypes.get(name) == "bfloat16":
                    t = t.view(torch.bfloat16)
                out[name] = t
        return out


def _as_numpy(name: str, value: Any) -> tuple[str, np.ndarray]:
    """Return (wire dtype, contiguous little-endian array) for a numpy array or CPU torch tensor."""
    if type(value).__module__.startswith("torch"):
        import torch

        if not isinstance(value, torch.Tensor):
            raise CodecError(f"array {name!r}: unsupported type {type(value).__name__}")
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return "bfloat16", np.ascontiguousarray(t.contiguous().view(torch.uint16).numpy())
        value = t.contiguous().numpy()
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise CodecError(f"array {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}")
    arr = value
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    wire = _NUMPY_TO_WIRE.get(arr.dtype.str)
    if wire is None:
        raise CodecError(f"array {name!r}: dtype {arr.dtype} is not supported on the wire")
    return wire, arr if arr.flags.c_contiguous else arr.copy(order="C")  # ascontiguousarray makes 0-d 1-d


def encode_parts(arrays: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> list[bytes | memoryview]:
    """Encode to a list of buffers whose concatenation is the message (lets writers skip one copy)."""
    specs: list[list[Any]] = []
    bufs: list[memoryview] = []
    offset = 0
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise CodecError(f"array name {name!r} must be a non-empty string of at most {MAX_NAME_CHARS} chars")
        wire, arr = _as_numpy(name, value)
        if arr.ndim > MAX_NDIM:
            raise CodecError(f"array {name!r}: {arr.ndim} dimensions exceed the limit of {MAX_NDIM}")
        pad = -offset % _ALIGN
        if pad:
            bufs.append(memoryview(b"\0" * pad))
            offset += pad
        specs.append([name, wire, list(arr.shape), offset, arr.nbytes])
        if arr.nbytes:
            bufs.append(arr.data.cast("B"))
        offset += arr.nbytes
    try:
        header = msgpack.packb({"meta": dict(meta or {}), "arrays": specs, "size": offset}, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"metadata is not msgpack-serialisable: {exc}") from exc
    if len(header) > MAX_HEADER_BYTES:
        raise CodecError(f"header of {len(header)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    return [_PREFIX.pack(MAGIC, len(header)), header, *bufs]


def encode(arrays: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> bytes:
    """Encode named arrays (numpy or CPU torch) plus msgpack-able metadata into one buffer."""
    return b"".join(encode_parts(arrays, meta))


def _check_spec(i: int, spec: Any, data_size: int) -> tuple[str, str, tuple[int, ...], int, int]:
    if not isinstance(spec, list) or len(spec) != 5:
        raise CodecError(f"array spec #{i} must be [name, dtype, shape, offset, nbytes], got {spec!r}")
    name, dtype, shape, offset, nbytes = spec
    if not isinstance(name, str) or not name:
        raise CodecError(f"array spec #{i}: name must be a non-empty string, got {name!r}")
    if dtype not in _DTYPES:
        raise CodecError(f"array {name!r}: unknown dtype {dtype!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise CodecError(f"array {name!r}: shape must be a list of at most {MAX_NDIM} non-negative ints")
    for label, v in (("offset", offset), ("nbytes", nbytes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise CodecError(f"array {name!r}: {label} must be a non-negative int, got {v!r}")
    expected = math.prod(shape) * _DTYPES[dtype].itemsize
    if nbytes != expected:
        raise CodecError(f"array {name!r}: header says {nbytes} bytes but shape {shape} of {dtype} is {expected}")
    if offset % _ALIGN:
        raise CodecError(f"array {name!r}: offset {offset} is not {_ALIGN}-byte aligned")
    if offset + nbytes > data_size:
        raise CodecError(f"array {name!r}: bytes {offset}..{offset + nbytes} run past the data ({data_size} bytes)")
    return name, dtype, tuple(shape), offset, nbytes


def decode(buf: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Frame:
    """Decode and validate a buffer made by `encode`; raise `CodecError` naming the problem."""
    if not isinstance(buf, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(buf).__name__}")
    view = memoryview(buf).cast("B")
    total = view.nbytes
    if total > max_bytes:
        raise CodecError(f"message of {total} bytes exceeds the limit of {max_bytes}")
    meta, specs, data = _split(view)
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    end = 0
    for i, spec in enumerate(specs):
        name, dtype, shape, offset, nbytes = _check_spec(i, spec, data.nbytes)
        if name in arrays:
            raise CodecError(f"array {name!r} appears twice")
        if offset < end:
            raise CodecError(f"array {name!r} overlaps the previous array")
        end = offset + nbytes
        arrays[name] = np.frombuffer(data[offset:end], dtype=_DTYPES[dtype]).reshape(shape)
        dtypes[name] = dtype
    return Frame(meta=meta, arrays=arrays, dtypes=dtypes)


def _split(view: memoryview) -> tuple[dict[str, Any], list[Any], memoryview]:
    """A message's prefix and header checked: its meta, its array specs (unchecked) and its data section."""
    total = view.nbytes
    if total < _PREFIX.size:
        raise CodecError(f"truncated message: {total} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}: not a Stellaris message (expected {MAGIC!r})")
    if header_len > MAX_HEADER_BYTES:
        raise CodecError(f"header length {header_len} exceeds the limit of {MAX_HEADER_BYTES}")
    data_start = _PREFIX.size + header_len
    if data_start > total:
        raise CodecError(f"truncated message: header needs {header_len} bytes, only {total - _PREFIX.size} left")
    try:
        header = msgpack.unpackb(view[_PREFIX.size : data_start], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise CodecError(f"corrupt header: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict) or not {"meta", "arrays", "size"} <= header.keys():
        raise CodecError("corrupt header: expected a map with 'meta', 'arrays' and 'size'")
    meta, specs, size = header["meta"], header["arrays"], header["size"]
    if not isinstance(meta, dict) or not isinstance(specs, list) or not isinstance(size, int):
        raise CodecError("corrupt header: 'meta' must be a map, 'arrays' a list, 'size' an int")
    data_size = total - data_start
    if size != data_size:
        kind = "truncated message" if data_size < size else "trailing bytes after the data"
        raise CodecError(f"{kind}: header says {size} data bytes, buffer has {data_size}")
    return meta, specs, view[data_start:]


# -- multi-field stream entries ---------------------------------------------------------------------------------
# A Redis Stream entry is a list of field/value pairs, so an entry can carry each array as its own field: the
# writer hands the arrays' own buffers to the socket (no concatenation copy) and a reader can look at the header
# field alone (metadata before payloads). Field "h" is the msgpack header {"meta", "arrays": [[name, dtype,
# shape, nbytes], ...]}; array i travels in field "a<i>".
HEADER_FIELD = b"h"


def encode_fields(arrays: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> list[bytes | memoryview]:
    """Flat [field, value, field, value, ...] for XADD: the header, then one field per array (zero-copy views)."""
    specs: list[list[Any]] = []
    out: list[bytes | memoryview] = []
    for i, (name, value) in enumerate(arrays.items()):
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise CodecError(f"array name {name!r} must be a non-empty string of at most {MAX_NAME_CHARS} chars")
        wire, arr = _as_numpy(name, value)
        if arr.ndim > MAX_NDIM:
            raise CodecError(f"array {name!r}: {arr.ndim} dimensions exceed the limit of {MAX_NDIM}")
        specs.append([name, wire, list(arr.shape), arr.nbytes])
        out += [f"a{i}".encode(), arr.data.cast("B") if arr.nbytes else b""]
    try:
        header = msgpack.packb({"meta": dict(meta or {}), "arrays": specs}, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"metadata is not msgpack-serialisable: {exc}") from exc
    if len(header) > MAX_HEADER_BYTES:
        raise CodecError(f"header of {len(header)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    return [HEADER_FIELD, header, *out]


def _fields_header(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    raw = fields.get(HEADER_FIELD)
    if raw is None:
        raise CodecError("entry has no header field 'h': not a Stellaris record")
    if len(raw) > MAX_HEADER_BYTES:
        raise CodecError(f"header of {len(raw)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise CodecError(f"corrupt header: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict):
        raise CodecError("corrupt header: expected a map with a 'meta' map")
    if not isinstance(header.get("arrays"), list):
        raise CodecError("corrupt header: 'arrays' must be a list")
    return header


def decode_fields_meta(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The metadata of a multi-field entry, without touching its arrays."""
    return _fields_header(fields)["meta"]


def decode_fields(fields: Mapping[bytes, bytes], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Frame:
    """Decode and validate a multi-field entry made by `encode_fields`; arrays are read-only views of the fields."""
    header = _fields_header(fields)
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    total = 0
    for i, spec in enumerate(header["arrays"]):
        if not isinstance(spec, list) or len(spec) != 4:
            raise CodecError(f"array spec #{i} must be [name, dtype, shape, nbytes], got {spec!r}")
        size = spec[3] if isinstance(spec[3], int) else 0
        name, dtype, shape, _, nbytes = _check_spec(i, [*spec[:3], 0, spec[3]], size)
        if name in arrays:
            raise CodecError(f"array {name!r} appears twice")
        buf = fields.get(f"a{i}".encode())
        if buf is None:
            raise CodecError(f"array {name!r}: field a{i} is missing")
        if len(buf) != nbytes:
            raise CodecError(f"array {name!r}: header says {nbytes} bytes but the field has {len(buf)}")
        total += nbytes
        if total > max_bytes:
            raise CodecError(f"entry of more than {max_bytes} bytes exceeds the limit")
        arrays[name] = np.frombuffer(buf, dtype=_DTYPES[dtype]).reshape(shape)
        dtypes[name] = dtype
    return Frame(meta=header["meta"], arrays=arrays, dtypes=dtypes)
