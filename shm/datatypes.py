"""Triton's tensor datatypes: names, numpy dtypes, sizes and the BYTES wire form.

Datatype names are the protocol's ("FP32"); config names carry a "TYPE_" prefix and
spell strings "TYPE_STRING". BYTES elements travel as a 4-byte little-endian length
followed by the bytes. BF16 has no numpy dtype: it is carried as raw uint16 words.
"""

import struct

import numpy as np

# protocol datatype -> numpy dtype (BYTES as object arrays of bytes)
NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(np.object_),
}

_SIZE = {name: (None if name == "BYTES" else dt.itemsize) for name, dt in NUMPY.items()}

_FROM_NUMPY = {dt: name for name, dt in NUMPY.items() if name != "BF16"}


def element_size(datatype: str) -> int | None:
    """Bytes per element, None for BYTES; KeyError for an unknown datatype."""
    return _SIZE[datatype]


def is_known(datatype: str) -> bool:
    return datatype in _SIZE


def to_numpy(datatype: str) -> np.dtype:
    return NUMPY[datatype]


def from_numpy(dtype) -> str:
    """Protocol datatype of a numpy dtype; str/bytes/object arrays are BYTES."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    return _FROM_NUMPY[dt]


def from_config(type_name: str) -> str:
    """'TYPE_FP32' -> 'FP32', 'TYPE_STRING' -> 'BYTES'."""
    name = type_name[5:] if type_name.startswith("TYPE_") else type_name
    return "BYTES" if name == "STRING" else name


def to_config(datatype: str) -> str:
    """'FP32' -> 'TYPE_FP32', 'BYTES' -> 'TYPE_STRING'."""
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def num_elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def byte_size(datatype: str, shape) -> int | None:
    """Byte size of a fixed-size tensor, None for BYTES (its size depends on content)."""
    size = _SIZE[datatype]
    return None if size is None else size * num_elements(shape)


_LEN = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Flatten a BYTES tensor (object/str/bytes array) into length-prefixed elements."""
    parts = []
    for item in np.asarray(array, dtype=object).reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes(buffer, count: int | None = None) -> np.ndarray:
    """Parse length-prefixed elements into a flat object array of bytes.

    With `count`, the buffer must hold exactly that many elements; ValueError otherwise
    (a length that runs past the end, or bytes left over).
    """
    view = memoryview(buffer).cast("B")
    out = []
    pos, end = 0, len(view)
    while pos < end and (count is None or len(out) < count):
        if pos + 4 > end:
            raise ValueError("BYTES element length prefix is truncated")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise ValueError("BYTES element runs past the end of the tensor data")
        out.append(bytes(view[pos:pos + n]))
        pos += n
    if count is not None and (len(out) != count or pos != end):
        raise ValueError(
            f"BYTES tensor data holds {len(out)} element(s) in {pos} of {end} bytes, "
            f"expected {count} element(s) filling the buffer")
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def tensor_from_buffer(datatype: str, shape, buffer) -> np.ndarray:
    """A numpy view (no copy) over raw tensor bytes; BYTES is parsed into objects."""
    if datatype == "BYTES":
        return deserialize_bytes(buffer, num_elements(shape)).reshape(shape)
    return np.frombuffer(buffer, dtype=NUMPY[datatype]).reshape(shape)


def tensor_to_buffer(datatype: str, array: np.ndarray):
    """Raw bytes of a tensor in Triton's layout: a zero-copy view when it can be."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    arr = np.ascontiguousarray(array)
    return memoryview(arr).cast("B") if arr.nbytes else b""
