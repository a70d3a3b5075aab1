"""Client shared-memory regions (Triton's system and CUDA shared-memory extensions).

The scheduler is the one registry: a frontend forwards every register, status and
unregister call to it and waits for the RegionReply. Requests name regions; the
scheduler resolves the name when the request arrives, checks the bounds, counts the
request as a user of the region until it finishes, and hands workers the key (and the
CUDA IPC handle) to map. A region being unregistered stays mapped until its last user
finishes; then workers hear RegionGone and unmap it.
"""

from __future__ import annotations

import enum

import msgspec

from shm.messages.results import Error

SYSTEM = "system"
CUDA = "cuda"
CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class RegionOp(enum.StrEnum):
    """A shared-memory call's operation (its value travels; an unknown one does not
    decode)."""

    REGISTER = "register"
    STATUS = "status"
    UNREGISTER = "unregister"


class RegionRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                    frozen=True):
    """A shared-memory call: `op` what it does; `kind` is SYSTEM or CUDA. An empty
    `name` means every region of that kind (status, unregister)."""

    call_id: int
    reply_to: str
    op: RegionOp
    kind: str
    name: str = ""
    key: str = ""  # system: the POSIX shm name the client created
    offset: int = 0  # system: where the region starts inside that object
    byte_size: int = 0
    device_id: int = 0  # cuda
    raw_handle: bytes = b""  # cuda: cudaIpcMemHandle_t, 64 bytes


class RegionStatus(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    name: str
    kind: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0


class RegionReply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """The answer to RegionRequest `call_id`: an error, or the regions a status call
    asked for."""

    call_id: int
    error: Error | None = None
    regions: list[RegionStatus] = []


class RegionShared(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                   frozen=True):
    """Scheduler -> frontends: a registered region, as workers map it, so that a
    frontend sending a request under a lease (shm/messages/leases.py) resolves its
    names itself. Unregistering it sends RegionUnshared."""

    uid: int
    name: str
    kind: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0
    raw_handle: bytes = b""


class RegionUnshared(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Scheduler -> frontends: the region `name` is unregistered."""

    name: str


def in_bounds(ref, byte_size: int) -> bool:
    """Whether a request's `ref` (offset and byte size within a region) fits a region
    of `byte_size` bytes."""
    return not (ref.offset < 0 or ref.nbytes < 0 or ref.offset >= byte_size
                or ref.offset + ref.nbytes > byte_size)


def bind(ref, region) -> None:
    """Turn `ref`, a tensor in the client region named by `ref.segment` (region -1),
    into what a worker maps (in place): the region's uid, and its POSIX key and offset
    or its CUDA IPC handle. `region` is the scheduler's registration or a frontend's
    RegionShared; the bounds are the caller's to check first (in_bounds)."""
    ref.region = region.uid
    ref.region_name = region.name
    if region.kind == SYSTEM:
        ref.segment = region.key
        ref.offset += region.offset
    else:
        ref.segment = ""
        ref.device = region.device_id
        ref.handle = region.raw_handle
        ref.region_size = region.byte_size  # the worker maps the whole allocation


class RegionGone(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Scheduler -> workers: the region with this uid is unregistered and no request
    uses it any more; unmap it."""

    uid: int
