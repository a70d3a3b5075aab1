"""CUDA, as far as every process needs it: counting devices without importing a
framework, and the CUDA IPC and pinned-memory calls workers make (through cupy).

The scheduler only counts devices (`device_count`, through the driver library, so it
pays no cupy import); only worker processes that touch device memory import cupy.
"""

from __future__ import annotations

import ctypes
import functools
import os

# SHMSERVE_FAKE_CUDA=N: N host-memory fake devices and a fake cupy (shm/cuda_fake.py),
# for running and profiling the CUDA-region path without a GPU; never in production
FAKE_DEVICES = int(os.environ.get("SHMSERVE_FAKE_CUDA") or 0)
if FAKE_DEVICES:
    from shm import cuda_fake
    cuda_fake.install()


@functools.cache
def device_count() -> int:
    """CUDA devices this process can use (CUDA_VISIBLE_DEVICES honoured); 0 without a
    driver. SHMSERVE_GPUS=0 hides every device (tests of the CPU-only behaviour)."""
    if os.environ.get("SHMSERVE_GPUS") == "0":
        return 0
    if FAKE_DEVICES:
        return FAKE_DEVICES
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    try:
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except AttributeError:
        return 0
    return count.value


# --cuda-sync: the primary context's scheduling flag (CUctx_flags' CU_CTX_SCHED_*)
CUDA_SYNC = {"auto": 0, "spin": 1, "yield": 2, "block": 4}


def set_sync(mode: str) -> list[int]:
    """How this process's threads wait for its GPUs, set on every visible device's
    primary context before a framework or cupy makes it current (what torch and cupy
    use); the devices it was set on. "auto" leaves CUDA's choice. A device whose
    context was made already keeps its flag (logged by the caller)."""
    flag = CUDA_SYNC[mode]
    if mode == "auto" or device_count() == 0:
        return []
    if FAKE_DEVICES:
        return cuda_fake.set_primary_flags(flag, FAKE_DEVICES)
    lib = ctypes.CDLL("libcuda.so.1")
    set_flags = (getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None)
                 or getattr(lib, "cuDevicePrimaryCtxSetFlags", None))
    if set_flags is None:  # a driver without it: CUDA's choice stays
        return []
    done = []
    for ordinal in range(device_count()):
        dev = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0 and \
                set_flags(dev, ctypes.c_uint(flag)) == 0:
            done.append(ordinal)
    return done


def cupy():
    """The cupy module, or an error that says how to get it."""
    try:
        import cupy as cp
    except ImportError as exc:
        raise RuntimeError("device memory needs cupy: install shmserve's gpu extra "
                           "(pip install 'shmserve[gpu]')") from exc
    return cp


class IpcRegion:
    """A client's CUDA memory, opened once in this process from its IPC handle."""

    def __init__(self, handle: bytes, device: int, byte_size: int):
        cp = cupy()
        self.device = device
        self.byte_size = byte_size
        with cp.cuda.Device(device):
            self.ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)
        mem = cp.cuda.UnownedMemory(self.ptr, byte_size, self, device)
        self._base = cp.cuda.MemoryPointer(mem, 0)

    def check(self, offset: int, nbytes: int) -> None:
        """ValueError unless [offset, offset + nbytes) lies inside the region."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.byte_size:
            raise ValueError(f"[{offset}, {offset + nbytes}) lies outside the CUDA region "
                             f"of {self.byte_size} bytes")

    def array(self, offset: int, nbytes: int, dtype, shape):
        """A cupy array over [offset, offset + nbytes) of the region (no copy)."""
        cp = cupy()
        self.check(offset, nbytes)
        return cp.ndarray(shape, dtype=dtype, memptr=self._base + offset)

    def close(self) -> None:
        cp = cupy()
        with cp.cuda.Device(self.device):
            cp.cuda.runtime.ipcCloseMemHandle(self.ptr)


def pin(buffer) -> int | None:
    """Register host memory as pinned (page-locked) so copies to and from devices run
    at DMA speed; returns its address, or None where that is not possible. Arena
    segments stay pinned for the life of the worker; client regions are unpinned
    (`unpin`) before they are unmapped."""
    import numpy as np
    cp = cupy()
    arr = np.frombuffer(buffer, dtype=np.uint8)
    ptr = arr.ctypes.data
    try:
        cp.cuda.runtime.hostRegister(ptr, arr.nbytes, 0)
    except Exception:
        return None
    return ptr


def unpin(ptr: int) -> None:
    """Undo `pin` (its address); memory that was never pinned is left alone."""
    try:
        cupy().cuda.runtime.hostUnregister(ptr)
    except Exception:
        pass
