"""CUDA shared-memory regions for the bench's clients (`--shm cuda`), through cupy.

tritonclient's `utils.cuda_shared_memory` needs the `cuda-python` package (its 2.73
reads the handle through cuda-bindings 13's `getPtr()`), which a GPU machine with only
torch and cupy lacks; every server process of ours opens regions through cupy anyway.
So the bench prefers this module, with the same five calls, and falls back to
tritonclient's where cupy is missing (`regions()`). A client module: never imported
by the server.
"""

from __future__ import annotations

import base64

import numpy as np

# cudaMemcpyDefault: the driver tells host from device by the pointers (UVA)
_MEMCPY_DEFAULT = 4


class Region:
    """One region: device memory of its own (cudaMalloc, never a pool's block, since
    an IPC handle names a whole allocation and a server would map its start)."""

    def __init__(self, name: str, ptr: int, byte_size: int, device: int, handle: bytes):
        self.name, self.ptr, self.byte_size = name, ptr, byte_size
        self.device, self.handle = device, handle


def _cupy():
    import shm.cuda  # noqa: F401 (SHMSERVE_FAKE_CUDA puts its fake cupy in place)
    import cupy
    return cupy


def create_shared_memory_region(name: str, byte_size: int, device_id: int) -> Region:
    cp = _cupy()
    with cp.cuda.Device(device_id):
        ptr = cp.cuda.runtime.malloc(max(byte_size, 1))
        try:
            handle = bytes(cp.cuda.runtime.ipcGetMemHandle(ptr))
        except BaseException:
            cp.cuda.runtime.free(ptr)
            raise
    return Region(name, ptr, byte_size, device_id, handle)


def get_raw_handle(region: Region) -> bytes:
    """The IPC handle in base64, as tritonclient's get_raw_handle gives it (the gRPC
    client decodes it, the HTTP client sends it as is)."""
    return base64.b64encode(region.handle)


def set_shared_memory_region(region: Region, values) -> None:
    """Copy host arrays into the region, one after another from its start (as
    tritonclient does); BYTES arrays come serialized, as one object."""
    cp = _cupy()
    offset = 0
    with cp.cuda.Device(region.device):
        for value in values:
            value = np.ascontiguousarray(value)
            if value.dtype == np.object_:
                value = np.frombuffer(value.item(), dtype=np.uint8)
            if offset + value.nbytes > region.byte_size:
                raise ValueError(f"{value.nbytes} bytes at {offset} overflow region "
                                 f"{region.name} of {region.byte_size} bytes")
            cp.cuda.runtime.memcpy(region.ptr + offset, value.ctypes.data, value.nbytes,
                                   _MEMCPY_DEFAULT)
            offset += value.nbytes


def get_contents_as_numpy(region: Region, datatype, shape) -> np.ndarray:
    """A host copy of the region's first bytes as a numeric array of `shape`."""
    cp = _cupy()
    out = np.empty(shape, dtype=datatype)
    if out.nbytes > region.byte_size:
        raise ValueError(f"region {region.name} holds {region.byte_size} bytes, "
                         f"not {out.nbytes}")
    if out.nbytes:
        with cp.cuda.Device(region.device):
            cp.cuda.runtime.memcpy(out.ctypes.data, region.ptr, out.nbytes,
                                   _MEMCPY_DEFAULT)
    return out


def destroy_shared_memory_region(region: Region) -> None:
    cp = _cupy()
    ptr, region.ptr = region.ptr, 0
    if ptr:
        with cp.cuda.Device(region.device):
            cp.cuda.runtime.free(ptr)


def regions():
    """The module the bench's streams use for CUDA regions: this one with cupy, else
    tritonclient's (which needs cuda-python); an error that says so without either."""
    try:
        _cupy()
        import sys
        return sys.modules[__name__]
    except ImportError:
        pass
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
        return cudashm
    except (ImportError, RuntimeError) as exc:  # tritonclient raises RuntimeError
        raise RuntimeError("--shm cuda needs cupy (or tritonclient's CUDA utilities, "
                           f"which need cuda-python): {exc}") from exc


def name() -> str:
    """Which implementation regions() picks, for a run's notes."""
    mod = regions()
    return "cupy" if mod.__name__ == __name__ else mod.__name__
