"""Results and buffer ownership: worker (or scheduler) -> requester, reader -> owner."""

from __future__ import annotations

import msgspec

from shm.errors import ErrorCode
from shm.tensor import TensorRef


class Error(msgspec.Struct, array_like=True, frozen=True):
    """Why a request or a call failed, in every reply that can fail: Triton's error
    class (an unknown one does not decode) and the message the client sees."""

    code: ErrorCode
    message: str


class InferResponse(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """One response to request `id` of the requester. Decoupled models may send several;
    the last carries `final`. Output blocks live in the arena of `owner` (an inbox
    address) and must be released to it with `ReleaseBlocks` once read."""

    id: int
    outputs: list[TensorRef] = []
    error: Error | None = None
    final: bool = True
    owner: str = ""
    model_version: int = 0
    cache_hit: bool = False  # answered from the response cache, outputs inline
    # a decoupled model's send(None, FINAL): the request is complete, no response
    # goes with it (frontends send one only with triton_enable_empty_final_response)
    empty: bool = False
    # response parameters (pb_utils.InferenceResponse(parameters=...)), as JSON values
    parameters: dict = {}
    # the batch that ran it lent its instance to the requester (workers/leases.py):
    # (lease id, instance, the worker's inbox, requests it may send at once)
    lease: tuple[int, str, str, int] | None = None


class ReleaseBlocks(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The reader (its inbox address) is done with these blocks of the recipient's
    arena: (segment, offset) pairs."""

    reader: str
    blocks: list[tuple[str, int]]


class PeerGone(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A process died or stopped: forget its inbox and unmap its segments (by prefix)."""

    address: str
    segment_prefix: str
