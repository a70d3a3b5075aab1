"""Tensor descriptors: what crosses a process boundary in place of tensor bytes."""

from __future__ import annotations

import msgspec

# Tensors up to this size travel inside the message; larger ones go through an arena.
# Below ~64 KiB, the copy into msgpack costs less than allocating, releasing and
# mapping an arena block (see scripts/bench_inline.py for the measurement).
INLINE_MAX = 64 * 1024


class TensorRef(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tensor's name, datatype, shape and where its bytes are.

    Exactly one of: `data` (inline bytes), or `segment`/`offset`/`nbytes` naming a block
    in a POSIX shared-memory segment (an arena block, or later a client's region).
    """

    name: str
    datatype: str
    shape: list[int]
    data: bytes | None = None
    segment: str = ""
    offset: int = 0
    nbytes: int = 0
