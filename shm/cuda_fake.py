"""A host-memory stand-in for the part of cupy that shmserve and its bench use, so the
CUDA-region path runs, and its host-side cost can be counted and profiled, on a
machine without a GPU. `SHMSERVE_FAKE_CUDA=N` (shm/cuda.py) gives every process N fake
devices and puts this module in sys.modules as `cupy`.

"Device memory" is host memory: an allocation is a POSIX shared-memory object, its IPC
handle is the object's name (so another process opens it, as cudaIpcOpenMemHandle
would), memcpy is memmove, and streams and events do nothing. Every runtime call is
counted in `CALLS` (per process), so tests can check what a request costs in calls:
IPC opens, stream synchronizations, stream creations, copies.

As with a real runtime, a process's device memory goes with the process: what it did
not free is unlinked at its exit, and the objects of a process that died without an
exit (kill -9) are unlinked by the next process of this host to allocate (their names
carry the allocating pid).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import itertools
import math
import mmap
import os
import sys
import types

import numpy as np

from shm import datatypes, dlpack

CALLS: collections.Counter = collections.Counter()
_KDL_CUDA = dlpack.KDL_CUDA
_ids = itertools.count()
_PREFIX = "shmserve-fakecuda-"


def _address(m: mmap.mmap) -> int:
    # the buffer export is dropped at once, so the map can still be closed later
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def _host(ptr: int, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=np.uint8) \
        if nbytes else np.empty(0, np.uint8)


class _Runtime:
    """cupy.cuda.runtime: the calls shm/cuda.py, workers and scheduler/bench_cuda.py make."""

    def __init__(self):
        self._owned: dict[int, tuple[str, mmap.mmap]] = {}  # malloc'd here
        self._opened: dict[int, mmap.mmap] = {}  # opened from a handle
        self._swept = False
        atexit.register(self._exit)

    def _exit(self) -> None:
        mine = f"{_PREFIX}{os.getpid()}-"  # a forked child's copy of the table is not
        for name, _ in self._owned.values():
            if name.startswith(mine):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/dev/shm/{name}")
        self._owned.clear()

    @staticmethod
    def _sweep_dead() -> None:
        """Unlink the objects of processes that are gone (a real device frees them)."""
        for name in os.listdir("/dev/shm"):
            if not name.startswith(_PREFIX):
                continue
            pid = name[len(_PREFIX):].partition("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/dev/shm/{name}")

    def getDeviceCount(self) -> int:
        return int(os.environ.get("SHMSERVE_FAKE_CUDA") or 1)

    def malloc(self, nbytes: int) -> int:
        CALLS["malloc"] += 1
        if not self._swept:
            self._swept = True
            self._sweep_dead()
        name = f"{_PREFIX}{os.getpid()}-{next(_ids)}"
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            m = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        ptr = _address(m)
        self._owned[ptr] = (name, m)
        return ptr

    def free(self, ptr: int) -> None:
        CALLS["free"] += 1
        name, m = self._owned.pop(ptr)
        m.close()
        os.unlink(f"/dev/shm/{name}")

    def ipcGetMemHandle(self, ptr: int) -> bytes:
        CALLS["ipcGetMemHandle"] += 1
        return self._owned[ptr][0].encode().ljust(64, b"\0")

    def ipcOpenMemHandle(self, handle: bytes, flags: int = 1) -> int:
        CALLS["ipcOpenMemHandle"] += 1
        name = bytes(handle).rstrip(b"\0").decode()
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        try:
            m = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        ptr = _address(m)
        self._opened[ptr] = m
        return ptr

    def ipcCloseMemHandle(self, ptr: int) -> None:
        CALLS["ipcCloseMemHandle"] += 1
        self._opened.pop(ptr).close()

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        CALLS["memcpy"] += 1
        ctypes.memmove(dst, src, nbytes)

    def memcpyAsync(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        CALLS["memcpy_async"] += 1
        ctypes.memmove(dst, src, nbytes)

    def hostRegister(self, ptr: int, nbytes: int, flags: int) -> None:
        CALLS["hostRegister"] += 1

    def hostUnregister(self, ptr: int) -> None:
        CALLS["hostUnregister"] += 1


PRIMARY_FLAGS: dict[int, int] = {}  # device -> the flag set_primary_flags gave it


def set_primary_flags(flag: int, devices: int) -> list[int]:
    """cuDevicePrimaryCtxSetFlags on each of `devices`: recorded, as CALLS counts."""
    for device in range(devices):
        CALLS["primary_ctx_set_flags"] += 1
        PRIMARY_FLAGS[device] = flag
    return list(range(devices))


class Stream:
    def __init__(self, non_blocking: bool = False, null: bool = False, ptr: int = 0):
        if not null:
            CALLS["stream_create"] += 1
        self.ptr = ptr

    def synchronize(self) -> None:
        CALLS["stream_synchronize"] += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class ExternalStream(Stream):
    def __init__(self, ptr: int, device_id: int = -1):
        super().__init__(null=True, ptr=ptr)


class Event:
    def __init__(self, *args, **kwargs):
        CALLS["event_create"] += 1

    def record(self, stream=None) -> None:
        CALLS["event_record"] += 1

    def synchronize(self) -> None:
        CALLS["event_synchronize"] += 1


_NULL_STREAM = Stream(null=True)


def get_current_stream(device=None) -> Stream:
    CALLS["get_current_stream"] += 1
    return _NULL_STREAM


class Device:
    def __init__(self, device: int = 0):
        self.id = int(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self) -> None:
        CALLS["device_synchronize"] += 1


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner, device_id: int = 0):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    def __init__(self, mem, offset: int):
        self.mem, self.ptr = mem, mem.ptr + offset

    def __add__(self, offset: int) -> "MemoryPointer":
        p = MemoryPointer(self.mem, 0)
        p.ptr = self.ptr + offset
        return p

    def copy_from_device_async(self, src: "MemoryPointer", nbytes: int, stream=None):
        CALLS["memcpy_async"] += 1
        ctypes.memmove(self.ptr, src.ptr, nbytes)


class _Flags:
    c_contiguous = True


class ndarray:
    """A device array: a numpy array over "device" memory, with cupy's surface that
    shmserve touches."""

    flags = _Flags()

    def __init__(self, shape, dtype=np.float32, memptr: MemoryPointer | None = None,
                 _host_array: np.ndarray | None = None):
        if _host_array is None:
            dtype = np.dtype(dtype)
            if memptr is None:
                _host_array = np.empty(shape, dtype)
            else:
                n = math.prod(shape) * dtype.itemsize
                _host_array = _host(memptr.ptr, n).view(dtype).reshape(shape)
        self._a = _host_array
        self._memptr = memptr

    @property
    def data(self) -> MemoryPointer:
        if self._memptr is None:
            a = self._a
            self._memptr = MemoryPointer(UnownedMemory(a.ctypes.data, a.nbytes, a), 0)
        return self._memptr

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    nbytes = property(lambda self: self._a.nbytes)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.data.ptr, False), "strides": None}

    def get(self, stream=None, out=None):
        CALLS["d2h"] += 1
        if out is None:
            return self._a.copy()
        out[...] = self._a
        return out

    def set(self, arr, stream=None) -> None:
        CALLS["h2d"] += 1
        self._a[...] = np.asarray(arr).reshape(self._a.shape)

    def copy(self) -> "ndarray":
        CALLS["d2d_kernel"] += 1
        return ndarray(None, _host_array=self._a.copy())

    def reshape(self, *shape) -> "ndarray":
        return ndarray(None, _host_array=self._a.reshape(*shape))

    def __setitem__(self, key, value) -> None:
        CALLS["d2d_kernel"] += 1
        self._a[key] = value._a if isinstance(value, ndarray) else value

    def __mul__(self, other) -> "ndarray":
        CALLS["kernel"] += 1
        return ndarray(None, _host_array=self._a * other)

    def __dlpack_device__(self):
        return (_KDL_CUDA, 0)

    def __dlpack__(self, stream=None):
        CALLS["dlpack_export"] += 1
        return dlpack.export(self.data.ptr, self.shape, datatypes.from_numpy(self.dtype),
                             (_KDL_CUDA, 0), self)


def asarray(value) -> ndarray:
    CALLS["h2d"] += 1
    return ndarray(None, _host_array=np.array(value))


def from_dlpack(obj) -> ndarray:
    """A device array over another's DLPack export (no copy)."""
    CALLS["dlpack_import"] += 1
    capsule = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
    info = dlpack.describe(capsule)
    keep = dlpack.DLImport(capsule, info)
    dtype = datatypes.to_numpy(dlpack.DL_TO_TYPE[(info.code, info.bits)])
    nbytes = math.prod(info.shape) * dtype.itemsize
    arr = ndarray(info.shape, dtype, MemoryPointer(UnownedMemory(info.data, nbytes, keep), 0))
    arr._keep = keep
    return arr


def module() -> types.ModuleType:
    """This module, with its `cuda` namespace, ready to stand in for cupy."""
    me = sys.modules[__name__]
    if not hasattr(me, "cuda"):
        cuda = types.ModuleType("cupy.cuda")
        cuda.runtime = _Runtime()
        cuda.Device, cuda.Stream, cuda.ExternalStream, cuda.Event = (
            Device, Stream, ExternalStream, Event)
        cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer
        cuda.get_current_stream = get_current_stream
        me.cuda = cuda
    return me


def install() -> types.ModuleType:
    """This module as `cupy` (and `cupy.cuda`) for the rest of the process."""
    me = module()
    sys.modules["cupy"], sys.modules["cupy.cuda"] = me, me.cuda
    return me


@contextlib.contextmanager
def counting():
    """CALLS from zero inside the block (what the block's calls were)."""
    CALLS.clear()
    yield CALLS
