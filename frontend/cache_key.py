"""The response cache key of a request, computed where the input bytes already are.

Triton hashes what its response cache docs call the inference request: the model name,
the model version, and each input's name, shape, datatype and data, inputs taken in
name order so that the order a client lists them in does not matter. shmserve does the
same with BLAKE2b (256-bit digests: Triton's 64-bit hash admits collisions its docs
warn about) and adds the names of the requested outputs, because a result holds only
the outputs its request asked for: without them, a request for every output could be
answered with the one output an earlier request asked for.

Each field is length-prefixed, so no two different requests feed the hash the same
byte stream.
"""

from __future__ import annotations

import hashlib
import struct

_LEN = struct.Struct("<Q")


def _field(h, data) -> None:
    view = memoryview(data)
    if not view.contiguous:
        view = memoryview(view.tobytes())
    h.update(_LEN.pack(view.nbytes))
    h.update(view)


def cache_key(model: str, version: int, inputs, outputs=None) -> bytes | None:
    """The key of a request for `model` `version` (the version that will run it, not
    the requested 0). `inputs` carry name, datatype, shape and data (bytes-like in raw
    layout); `outputs` the requested outputs (anything with a `name`); the caller
    passes the config's outputs for "every output", so both spellings share a key
    (None, when the config lists none, keys as "every output"). Returns None when the request cannot be cached: an input in a client
    shared-memory region (data None), whose bytes this process does not map."""
    if any(inp.data is None for inp in inputs):
        return None
    h = hashlib.blake2b(digest_size=32)
    _field(h, model.encode())
    h.update(_LEN.pack(version))
    h.update(_LEN.pack(len(inputs)))
    for inp in sorted(inputs, key=lambda i: i.name):
        _field(h, inp.name.encode())
        _field(h, inp.datatype.encode())
        h.update(_LEN.pack(len(inp.shape)))
        for d in inp.shape:
            h.update(_LEN.pack(d & 0xFFFFFFFFFFFFFFFF))
        _field(h, inp.data)
    if outputs is None:
        h.update(b"*")  # every output
    else:
        names = sorted({o.name for o in outputs})
        h.update(_LEN.pack(len(names)))
        for name in names:
            _field(h, name.encode())
    return h.digest()
