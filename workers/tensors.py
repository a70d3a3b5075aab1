"""Tensors in and out of a worker: descriptors to numpy views, numpy arrays to blocks."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from shm import datatypes
from shm.arena import Arena, SegmentCache
from shm.tensor import INLINE_MAX, TensorRef


def input_array(ref: TensorRef, segments: SegmentCache) -> np.ndarray:
    """A numpy view of an input: over the message bytes, or in place in the arena block
    the frontend wrote (no copy; BYTES are parsed into objects, which must copy)."""
    if ref.data is not None:
        buf = ref.data
    else:
        buf = segments.view(ref.segment, ref.offset, ref.nbytes)
    return datatypes.tensor_from_buffer(ref.datatype, ref.shape, buf)


class OutputWriter:
    """Puts output tensors where the requester can read them: inline when small, else in
    a block of this worker's arena, to be released by the reader."""

    def __init__(self, arena: Arena, owner: str):
        self.arena = arena
        self.owner = owner
        # blocks each reader holds, so a reader that dies does not leak them
        self._held: dict[str, set[tuple[str, int]]] = {}

    def write(self, outputs: Iterable[tuple[str, str, np.ndarray]], reader: str) -> list[TensorRef]:
        refs = []
        for name, datatype, array in outputs:
            buf = datatypes.tensor_to_buffer(datatype, array)
            shape = list(array.shape)
            n = len(buf) if isinstance(buf, bytes) else buf.nbytes
            if n <= INLINE_MAX:
                refs.append(TensorRef(name, datatype, shape, data=bytes(buf)))
                continue
            segment, offset, view = self.arena.alloc(n)
            view[:] = buf  # the one copy of this output: model memory -> shared memory
            self._held.setdefault(reader, set()).add((segment, offset))
            refs.append(TensorRef(name, datatype, shape, segment=segment, offset=offset,
                                  nbytes=n))
        return refs

    def released(self, reader: str, blocks) -> None:
        held = self._held.get(reader)
        for segment, offset in blocks:
            self.arena.free(segment, offset)
            if held is not None:
                held.discard((segment, offset))

    def forget_reader(self, reader: str) -> None:
        for segment, offset in self._held.pop(reader, ()):
            self.arena.free(segment, offset)
