"""Client shared-memory regions as workers see them, and the rules for their keys.

A client's system region is a POSIX shm object it created (`tritonclient.utils.
shared_memory`); the scheduler checked its key and bounds when it was registered. A
worker maps the object once, by the uid the scheduler gave the registration, and
reads inputs and writes outputs in place. Because the client owns the object and could
shrink it behind our back, every use re-checks the object's size (one fstat) so that
no request makes the worker touch a page past its end.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading

from shm.arena import SHM_DIR

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


class RegionTruncated(ValueError):
    """The client shrank its object below what a request uses: touching those pages
    would fault (SIGBUS) the process that maps it."""


class _SystemMap:
    __slots__ = ("fd", "map", "view", "pinned")

    def __init__(self, key: str):
        self.fd = open_client_object(key, os.O_RDWR)
        try:
            size = os.fstat(self.fd).st_size
            if size == 0:
                raise RegionTruncated(f"shared memory object '{key}' is empty: "
                                      "it was truncated after it was registered")
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.map)
        self.pinned = None  # the address the pin hook registered, if any

    def close(self) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:
            pass  # a view still handed out; the mapping goes with it
        os.close(self.fd)


class RegionMaps:
    """The client regions this process has mapped, by registration uid. Thread-safe:
    framework instances read and write regions from their own threads.

    A GPU worker passes `pin`/`unpin` (shm.cuda's): each system region is then
    page-locked once when first mapped, up to `pin_max` bytes, so that copies between
    it and a device run at DMA speed instead of through the driver's staging buffer,
    and unlocked before it is unmapped."""

    def __init__(self, pin=None, unpin=None, pin_max: int = 1 << 30):
        self.pin, self.unpin, self.pin_max = pin, unpin, pin_max
        self._system: dict[int, _SystemMap] = {}
        self._cuda: dict[int, object] = {}
        self._lock = threading.Lock()

    def view(self, uid: int, key: str, offset: int, nbytes: int) -> memoryview:
        """Writable bytes [offset, offset + nbytes) of system region `uid` (object `key`)."""
        m = self._system.get(uid)
        if m is None:
            with self._lock:
                m = self._system.get(uid)
                if m is None:
                    m = _SystemMap(key)
                    if self.pin is not None and 0 < len(m.view) <= self.pin_max:
                        m.pinned = self.pin(m.view)
                    self._system[uid] = m
        end = offset + nbytes
        if offset < 0 or nbytes < 0 or end > len(m.view):
            raise ValueError(f"[{offset}, {end}) lies outside shared memory object '{key}'")
        size = os.fstat(m.fd).st_size
        if end > size:
            # checked before every use: the SIGBUS restart of the worker stays only a
            # backstop for a client that shrinks the object in the middle of a copy
            raise RegionTruncated(f"shared memory object '{key}' was truncated to "
                                  f"{size} bytes after it was registered: [{offset}, "
                                  f"{end}) lies outside it")
        return m.view[offset:end]

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
            m = self._system.pop(uid, None)
            r = self._cuda.pop(uid, None)
        if m is not None:
            if m.pinned is not None:
                self.unpin(m.pinned)
            m.close()
        if r is not None:
            r.close()

    def close(self) -> None:
        for uid in list(self._system) + list(self._cuda):
            self.forget(uid)
