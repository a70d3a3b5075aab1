"""Client shared-memory regions as workers see them, and the rules for their keys.

A client's system region is a POSIX shm object it created (`tritonclient.utils.
shared_memory`); the scheduler checked its key and bounds when it was registered. A
worker opens the object once, by the uid the scheduler gave the registration.

The client owns the object and may shrink it at any moment, also in the middle of a
request that uses it. A page past the new end of a mapping faults (SIGBUS) whoever
touches it, which kills the worker and fails every request in flight on it, whoever
sent them (issue 25). So the CPU never touches a client's object through a mapping:
inputs are read with preadv and outputs written with pwrite on its descriptor, where
a shrunken object is a short read (RegionTruncated: the request using it fails, alone)
instead of a fault. That is one copy per input, the one a batch makes anyway when it
gathers its requests. Only a GPU worker maps an object, page-locked, for the device
to copy from and to by DMA: the driver holds the pinned pages, so a copy after a shrink
does not fault (seen on an H200, where the same copy from an unpinned mapping was a
SIGBUS); the CPU never reads or writes that mapping.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
import threading

import numpy as np

from shm.arena import SHM_DIR
from shm.errors import ErrorCode, InferError

# The server's own segments are never a client's region: a client that registered one
# could read other clients' tensors.
SERVER_PREFIX = "shmserve-"


def check_client_key(key: str) -> str:
    """The object name under /dev/shm for a client's key (`/name` or `name`), or
    ValueError. Keys are POSIX shm names only: one path component, no dot-dot."""
    name = key[1:] if key.startswith("/") else key
    if (not name or "/" in name or name in (".", "..") or "\0" in name
            or len(name) > 255):
        raise ValueError(f"invalid shared memory key '{key}': expected a POSIX "
                         "shared-memory name such as '/my_region'")
    if name.startswith(SERVER_PREFIX):
        raise ValueError(f"shared memory key '{key}' names the server's own memory")
    return name


class NotSharedMemory(OSError):
    """The key names something in /dev/shm that is not a shm object (a FIFO, a
    directory, a device): Triton's mmap of it fails, which it calls invalid args."""


def open_client_object(key: str, flags: int) -> int:
    """A descriptor of the client's shm object `key`, or OSError.

    The name is the client's, so the file may be anything it could make in /dev/shm:
    O_NONBLOCK keeps a FIFO from blocking the opener (the scheduler's one loop) until a
    writer appears, O_NOFOLLOW refuses a symlink that would let the client read and
    write any file the server can, and only a regular file (a real shm object) is kept.
    """
    fd = os.open(os.path.join(SHM_DIR, check_client_key(key)),
                 flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotSharedMemory(22, "not a shared memory object")
    except BaseException:
        os.close(fd)
        raise
    return fd


def object_size(key: str) -> int:
    """Size of the client's shm object `key`; OSError when it cannot be opened."""
    fd = open_client_object(key, os.O_RDONLY)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


class RegionTruncated(InferError):
    """The client shrank its object below what a request uses: the request fails (its
    client's own doing: INVALID_ARG), and nothing else does."""

    def __init__(self, name: str, key: str, size: int, what: str, offset: int, end: int):
        super().__init__(ErrorCode.INVALID_ARG,
                         f"shared memory region '{name}' was truncated after it was "
                         f"registered: {what} needs bytes [{offset}, {end}) of its "
                         f"object '{key}', which holds {size}")


# A read or write moves at most this much per call (Linux's own cap is ~2 GiB)
_MAX_IO = 1 << 30
_MAX_END = (1 << 63) - 1  # off_t
# A read larger than this checks the object's size first: the fstat (~2 us) is nothing
# next to the read, and a shrunken object fails before its bytes are allocated.
_CHECK_FIRST = 1 << 20

_pagemap: list = []  # this process's /proc/self/pagemap descriptor, once opened


def _mapped(addr: int) -> bool | None:
    """Whether this process has a page mapped at `addr` (/proc/self/pagemap's present
    bit, which needs no privilege); None where that cannot be read."""
    if not _pagemap:
        try:
            _pagemap.append(os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            _pagemap.append(None)
    fd = _pagemap[0]
    if fd is None:
        return None
    try:
        entry = os.pread(fd, 8, addr // mmap.PAGESIZE * 8)
    except OSError:
        return None
    return len(entry) == 8 and bool(entry[7] & 0x80)


class _SystemObject:
    """A client's object: its descriptor, and on a GPU worker a mapping of it that the
    device copies from and to (page-locked once, on first use)."""

    __slots__ = ("fd", "map", "view", "pinned", "pin_tried", "addr", "stale")

    def __init__(self, key: str):
        self.fd = open_client_object(key, os.O_RDWR)
        self.map = self.view = self.pinned = None
        self.pin_tried = False
        self.addr = 0  # where the mapping starts
        self.stale = False  # shrunk since it was pinned: see dma_view

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            try:
                self.map.close()
            except BufferError:
                pass  # a view still handed out; the mapping goes with it
        os.close(self.fd)


class RegionMaps:
    """The client regions this process uses, by registration uid. Thread-safe:
    framework instances read and write regions from their own threads.

    A GPU worker passes `pin`/`unpin` (shm.cuda's): a system region the device copies
    from or to is then mapped and page-locked once, up to `pin_max` bytes, so that
    those copies run at DMA speed, and unlocked before it is unmapped."""

    def __init__(self, pin=None, unpin=None, pin_max: int = 1 << 30):
        self.pin, self.unpin, self.pin_max = pin, unpin, pin_max
        self._system: dict[int, _SystemObject] = {}
        self._cuda: dict[int, object] = {}
        self._lock = threading.Lock()

    def _object(self, uid: int, key: str, name: str) -> _SystemObject:
        obj = self._system.get(uid)
        if obj is None:
            with self._lock:
                obj = self._system.get(uid)
                if obj is None:
                    try:
                        obj = self._system[uid] = _SystemObject(key)
                    except OSError as exc:  # e.g. its client unlinked it meanwhile
                        raise InferError(ErrorCode.INVALID_ARG,
                                         f"shared memory region '{name or key}': its "
                                         f"object '{key}' cannot be opened: "
                                         f"{exc.strerror}") from None
        return obj

    def read(self, uid: int, key: str, offset: int, nbytes: int, out=None,
             name: str = "", what: str = "the input") -> np.ndarray:
        """Bytes [offset, offset + nbytes) of system region `uid` (object `key`), read
        into `out` (a writable C-contiguous array of nbytes) or a new uint8 array;
        RegionTruncated when the object ends before them."""
        end = offset + nbytes
        if offset < 0 or nbytes < 0 or end > _MAX_END:
            raise ValueError(f"[{offset}, {end}) lies outside shared memory object '{key}'")
        fd = self._object(uid, key, name).fd
        if nbytes > _CHECK_FIRST:  # one fstat before taking that much memory
            size = os.fstat(fd).st_size
            if end > size:
                raise RegionTruncated(name or key, key, size, what, offset, end)
        buf = np.empty(nbytes, np.uint8) if out is None else out
        if buf.nbytes != nbytes:
            raise ValueError(f"{buf.nbytes} bytes to read {nbytes} into")
        done = os.preadv(fd, (buf,), offset) if nbytes <= _MAX_IO else 0
        if done < nbytes:
            flat = buf.reshape(-1).view(np.uint8)
            while done < nbytes:
                got = os.preadv(fd, (flat[done:done + _MAX_IO],), offset + done)
                if not got:  # the end of the object: it was shrunk
                    raise RegionTruncated(name or key, key, os.fstat(fd).st_size, what,
                                          offset, end)
                done += got
        return buf

    def write(self, uid: int, key: str, offset: int, data, name: str = "",
              what: str = "the output") -> None:
        """Write `data` (bytes-like) at `offset` of system region `uid`; RegionTruncated
        when the object no longer reaches its end. (Shrunk between this check and the
        write, the object grows back to the end of what is written: the client's own
        object, within what it registered.)"""
        fd = self._object(uid, key, name).fd
        data = memoryview(data).cast("B")
        end = offset + len(data)
        if offset < 0:
            raise ValueError(f"[{offset}, {end}) lies outside shared memory object '{key}'")
        size = os.fstat(fd).st_size
        if end > size:
            raise RegionTruncated(name or key, key, size, what, offset, end)
        done = 0
        try:
            while done < len(data):
                done += os.pwrite(fd, data[done:done + _MAX_IO], offset + done)
        except OSError as exc:  # e.g. ENOSPC: the client's object, not our fault either
            raise InferError(ErrorCode.INVALID_ARG,
                             f"failed to write {what} into shared memory region "
                             f"'{name or key}': {exc.strerror}") from None

    def dma_view(self, uid: int, key: str, offset: int, nbytes: int, name: str = "",
                 what: str = "the tensor") -> memoryview | None:
        """Bytes [offset, offset + nbytes) of system region `uid` as a view over its
        page-locked mapping, for a device to copy from or to, never for the CPU to
        touch; None where the region is not pinned (no pin hooks, over `pin_max`, or
        refused by the driver): the caller then reads or writes a host copy."""
        if self.pin is None:
            return None
        obj = self._object(uid, key, name)
        if not obj.pin_tried:
            with self._lock:
                if not obj.pin_tried:
                    self._map_pinned(obj)
                    obj.pin_tried = True
        if obj.pinned is None or obj.stale:
            return None
        end = offset + nbytes
        if offset < 0 or nbytes < 0 or end > len(obj.view):
            return None
        size = os.fstat(obj.fd).st_size
        if end > size:
            raise RegionTruncated(name or key, key, size, what, offset, end)
        if nbytes and _mapped(obj.addr + end - 1) is False:
            # Shrunk (and grown back) since it was pinned: the kernel took its pages
            # out of our mapping (a shrink into the range takes its last page), but
            # the driver still holds the old ones, and a device copy would read or
            # write those (seen on an H200: an output copied there never reached the
            # regrown object). From now on through the host; unpinned when forgotten,
            # once no copy can be using it.
            obj.stale = True
            return None
        return obj.view[offset:end]

    def _map_pinned(self, obj: _SystemObject) -> None:
        size = os.fstat(obj.fd).st_size
        if not 0 < size <= self.pin_max:
            return
        try:
            obj.map = mmap.mmap(obj.fd, size)
        except (OSError, ValueError):
            return  # copied through the host instead
        obj.view = memoryview(obj.map)
        obj.addr = ctypes.addressof(ctypes.c_char.from_buffer(obj.map))
        # the driver faults the pages in itself (an object shrunk meanwhile makes it
        # refuse: None), so the CPU never touches them
        obj.pinned = self.pin(obj.view)
        if obj.pinned is None:  # no use for a mapping the device cannot copy from
            obj.view.release()
            obj.map.close()
            obj.map = obj.view = None

    def cuda(self, uid: int, handle: bytes, device: int, byte_size: int):
        """The CUDA region `uid`, opened from its IPC handle on first use."""
        r = self._cuda.get(uid)
        if r is None:
            with self._lock:
                r = self._cuda.get(uid)
                if r is None:
                    from shm.cuda import IpcRegion
                    r = self._cuda[uid] = IpcRegion(handle, device, byte_size)
        return r

    def forget(self, uid: int) -> None:
        with self._lock:
            obj = self._system.pop(uid, None)
            r = self._cuda.pop(uid, None)
        if obj is not None:
            if obj.pinned is not None:
                self.unpin(obj.pinned)
            obj.close()
        if r is not None:
            r.close()

    def close(self) -> None:
        for uid in list(self._system) + list(self._cuda):
            self.forget(uid)
