"""Tensor descriptors: what crosses a process boundary in place of tensor bytes."""

from __future__ import annotations

import msgspec

# Tensors up to this size travel inside the message; larger ones go through an arena.
# Below ~64 KiB, the copy into msgpack costs less than allocating, releasing and
# mapping an arena block (see scripts/bench_inline.py for the measurement).
INLINE_MAX = 64 * 1024


class TensorRef(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tensor's name, datatype, shape and where its bytes are.

    Exactly one of: `data` (inline bytes), or `segment`/`offset`/`nbytes` naming bytes
    in shared memory:
    - `region` 0: a block of a server arena (`segment` is its POSIX shm name);
    - `region` -1: a client region by the name the client registered (`segment`),
      `offset` relative to the region, as frontends send it; the scheduler resolves it;
    - `region` > 0: a resolved client region, the uid the scheduler gave it: `segment`
      is the POSIX key (system memory) and `offset` counts from the start of the
      key's object; with `device` >= 0 the bytes are CUDA memory on that device,
      opened from `handle` (a CUDA IPC handle) and `offset` counts from its base;
      `region_name` is the name the client registered it by, for errors.
    """

    name: str
    datatype: str
    shape: list[int]
    data: bytes | None = None
    segment: str = ""
    offset: int = 0
    nbytes: int = 0
    region: int = 0
    device: int = -1
    handle: bytes = b""
    region_size: int = 0  # CUDA regions: the size of the allocation `handle` opens
    region_name: str = ""


def arena_blocks(refs) -> list[tuple[str, int]]:
    """(segment, offset) of the refs whose bytes are a server arena block, the ones a
    reader releases: not inline, not in a client region."""
    return [(r.segment, r.offset) for r in refs if r.data is None and not r.region]
