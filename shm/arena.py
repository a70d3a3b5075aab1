"""POSIX shared-memory segments, single-owner arenas and a reader-side segment cache.

An `Arena` belongs to exactly one process: only it allocates, frees, creates and unlinks
its segments. Other processes map those segments through a `SegmentCache` and touch only
the blocks handed to them. Segments are reused: writing into fresh pages costs a page
fault per 4 KiB (~1 GB/s here) while a warm copy runs at tens of GB/s, so a segment per
request would be slower than the network. The first chunk is pre-faulted and kept for
the life of the process; later segments are created sparse (tmpfs gives a page when it
is first written), so a block reserved for bytes that never come costs no memory, and
they go back to the system once wholly free while the arena is past its high-water mark.

We open `/dev/shm/<name>` directly instead of `multiprocessing.shared_memory`, whose
resource tracker would unlink segments it believes a reader leaked.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
import time

import numpy as np

SHM_DIR = "/dev/shm"
ALIGN = 256  # covers cache lines and the alignment CUDA copies like
PAGE = mmap.PAGESIZE
# Linux 5.14+; Python 3.11's mmap module does not name it yet.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# Frees a shared mapping's pages and their tmpfs backing (a hole punched in the file),
# for every process that maps it; what is read there afterwards is zeros.
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", 9)
# An arena's segments add up to at most this many chunks once free ones are given back
# (see Arena); below it a free segment is kept IDLE_GIVE_BACK seconds for reuse.
HIGH_WATER_CHUNKS = 4
# a segment past the floor that stays wholly free this long goes back to the system, as
# allocators let freed pages decay: a steady stream of large requests keeps reusing its
# segments, while what a burst or an attacker made them grow is gone seconds after
IDLE_GIVE_BACK = 2.0


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def check_name(name: str) -> None:
    """Segment names are plain POSIX shm names: no path separators, no dot-dot."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"invalid shared-memory name {name!r}")


class Segment:
    """One mapped POSIX shared-memory object."""

    __slots__ = ("name", "size", "_map", "view", "owned")

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owned: bool):
        self.name = name
        self.size = size
        self._map = mapping
        self.view = memoryview(mapping)
        self.owned = owned

    @classmethod
    def create(cls, name: str, size: int, prefault: bool = True) -> "Segment":
        check_name(name)
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(os.path.join(SHM_DIR, name))
            raise
        os.close(fd)
        seg = cls(name, size, mapping, owned=True)
        if prefault:
            seg.prefault()
        return seg

    @classmethod
    def attach(cls, name: str) -> "Segment":
        check_name(name)
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mapping, owned=False)

    def prefault(self) -> None:
        """Touch every page once so the hot path never pays for a page fault."""
        try:
            self._map.madvise(_MADV_POPULATE_WRITE)
            return
        except (OSError, ValueError):
            pass  # kernels before 5.14: touch the pages one by one
        zero = bytes(1)
        for off in range(0, self.size, PAGE):
            self._map[off:off + 1] = zero

    def punch(self) -> None:
        """Give every page back to the system (the file keeps its size: a mapping that
        still reads it sees zeros, never SIGBUS). Only for a segment nobody uses."""
        try:
            self._map.madvise(_MADV_REMOVE)
        except (OSError, ValueError):
            pass  # not tmpfs, or no MADV_REMOVE: unlinking still frees it once unmapped

    def close(self) -> None:
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            # A numpy view handed to a model still points here; the mapping goes when
            # that view does. Unlinking the name below is what frees the memory.
            pass

    def unlink(self) -> None:
        if not self.owned:
            raise PermissionError(f"segment {self.name} is not owned by this process")
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass


def address_of(buf) -> int:
    """The address of a buffer's first byte."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


class _FreeList:
    """First-fit allocator over one segment, with coalescing of neighbours on free."""

    __slots__ = ("starts", "sizes", "used")

    def __init__(self, size: int):
        self.starts = [0]
        self.sizes = [size]
        self.used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        for i, size in enumerate(self.sizes):
            if size >= nbytes:
                off = self.starts[i]
                if size == nbytes:
                    del self.starts[i]
                    del self.sizes[i]
                else:
                    self.starts[i] = off + nbytes
                    self.sizes[i] = size - nbytes
                self.used[off] = nbytes
                return off
        return None

    def free(self, off: int) -> None:
        nbytes = self.used.pop(off)
        i = bisect.bisect_left(self.starts, off)
        # merge with the following free block
        if i < len(self.starts) and self.starts[i] == off + nbytes:
            nbytes += self.sizes[i]
            del self.starts[i]
            del self.sizes[i]
        # merge with the preceding free block
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == off:
            self.sizes[i - 1] += nbytes
        else:
            self.starts.insert(i, off)
            self.sizes.insert(i, nbytes)

    @property
    def free_bytes(self) -> int:
        return sum(self.sizes)


class Arena:
    """Blocks in a growing set of segments named `<prefix>-<n>`, owned by one process.

    The first chunk-sized segment is the warm floor: pre-faulted (with `prefault`) and
    kept. Every other segment, a chunk or a request larger than the chunk in a segment
    of its own, is created sparse, its pages allocated as they are first written. A
    segment that becomes wholly free is kept for reuse for `idle_give_back` seconds
    (the owner calls trim() when next_trim() says) while the arena's segments add up to
    at most `high_water` bytes, and given back at once past that: punched (its pages go
    back at once, even while readers still map it) and unlinked. Only whole segments
    are given back: a free range inside a segment in use may be pinned for DMA by a GPU
    worker, whose pinned pages a punched hole would leave behind.
    """

    def __init__(self, prefix: str, chunk_size: int = 64 << 20, prefault: bool = True,
                 on_segment=None, high_water: int | None = None, on_release=None,
                 idle_give_back: float = IDLE_GIVE_BACK):
        check_name(prefix)
        # called with each new segment's view (a GPU worker pins it for DMA), and with
        # the view of each segment given back, before it is unmapped (unpins it)
        self.on_segment = on_segment
        self.on_release = on_release
        self.prefix = prefix
        self.chunk_size = _round_up(chunk_size, PAGE)
        self.prefault = prefault
        self.high_water = (HIGH_WATER_CHUNKS * self.chunk_size if high_water is None
                           else max(0, high_water))
        self.segments: dict[str, Segment] = {}
        self._lists: dict[str, _FreeList] = {}
        self._order: list[str] = []
        self._bases: dict[str, int] = {}
        self._counter = 0
        self._floor: str | None = None  # the warm first chunk, never given back
        self.capacity = 0  # bytes of all segments
        self.idle_give_back = idle_give_back
        # wholly free segments past the floor: since when (monotonic); trim() gives back
        self.idle: dict[str, float] = {}

    def _grow(self, nbytes: int) -> str:
        size = max(self.chunk_size, _round_up(nbytes, PAGE))
        name = f"{self.prefix}-{self._counter}"
        self._counter += 1
        floor = self._floor is None and size == self.chunk_size
        seg = self.segments[name] = Segment.create(name, size,
                                                   prefault=floor and self.prefault)
        if floor:
            self._floor = name
        self._lists[name] = _FreeList(size)
        self._bases[name] = address_of(seg.view)
        self._order.append(name)
        self.capacity += size
        if self.on_segment is not None:
            self.on_segment(seg.view)
        return name

    def alloc(self, nbytes: int) -> tuple[str, int, memoryview]:
        """A block of at least `nbytes`: (segment name, offset, writable view)."""
        need = _round_up(max(nbytes, 1), ALIGN)
        for name in self._order:
            off = self._lists[name].alloc(need)
            if off is not None:
                if self.idle:
                    self.idle.pop(name, None)
                return name, off, self.segments[name].view[off:off + nbytes]
        name = self._grow(need)
        off = self._lists[name].alloc(need)
        return name, off, self.segments[name].view[off:off + nbytes]

    def free(self, name: str, offset: int) -> None:
        """Return a block; unknown blocks are ignored (a stale release after a restart)."""
        lst = self._lists.get(name)
        if lst is not None and offset in lst.used:
            lst.free(offset)
            if not lst.used and name != self._floor:
                if self.capacity > self.high_water:
                    self._give_back(name)
                else:
                    self.idle[name] = time.monotonic()

    def next_trim(self) -> float | None:
        """Seconds until trim() has a segment to give back; None when none is idle."""
        if not self.idle:
            return None
        return max(0.0, min(self.idle.values()) + self.idle_give_back - time.monotonic())

    def trim(self) -> int:
        """Give back the segments wholly free for `idle_give_back` seconds; bytes."""
        cutoff = time.monotonic() - self.idle_give_back
        gone = 0
        for name, since in list(self.idle.items()):
            if since <= cutoff:
                gone += self.segments[name].size
                self._give_back(name)
        return gone

    def _give_back(self, name: str) -> None:
        """A wholly free segment goes: its pages now, its name and mapping with them.
        Readers drop their mappings of it when they next map a new segment
        (SegmentCache); names are never reused, so a stale mapping is never read."""
        seg = self.segments.pop(name)
        self.idle.pop(name, None)
        del self._lists[name], self._bases[name]
        self._order.remove(name)
        self.capacity -= seg.size
        if self.on_release is not None:
            self.on_release(seg.view)
        seg.punch()
        seg.unlink()
        seg.close()

    def locate(self, buf) -> tuple[str, int] | None:
        """(segment, offset) if `buf` already lies inside one of this arena's segments."""
        if not self._bases:
            return None
        addr = address_of(buf)
        for name, base in self._bases.items():
            if base <= addr < base + self.segments[name].size:
                return name, addr - base
        return None

    def used_bytes(self) -> int:
        return sum(sum(lst.used.values()) for lst in self._lists.values())

    def resident_bytes(self) -> int:
        """Bytes of memory the segments hold now (tmpfs counts the pages written)."""
        total = 0
        for name in self.segments:
            try:
                total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
            except FileNotFoundError:
                pass
        return total

    def close(self) -> None:
        """Unmap and unlink every segment (the owner's job, once, at exit)."""
        for seg in self.segments.values():
            seg.unlink()
            seg.close()
        self.segments.clear()
        self._lists.clear()
        self._order.clear()
        self._bases.clear()
        self.idle.clear()
        self.capacity = 0


class SegmentCache:
    """Segments of other processes, mapped once on first use and kept until their owner
    gives them back (unlinks them): the mappings of segments gone are dropped whenever a
    new segment is mapped, which is when an owner that gave one back has made another."""

    def __init__(self, on_map=None, on_unmap=None):
        self._segments: dict[str, Segment] = {}
        self._lock = threading.Lock()  # framework workers read from several threads
        self.on_map = on_map  # called with each newly mapped segment's view
        self.on_unmap = on_unmap  # and with each one's view before it is unmapped

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        seg = self._segments.get(name)
        if seg is None:
            with self._lock:
                seg = self._segments.get(name)
                if seg is None:
                    self._drop_gone()
                    seg = Segment.attach(name)
                    if self.on_map is not None:
                        self.on_map(seg.view)
                    self._segments[name] = seg
        if offset < 0 or nbytes < 0 or offset + nbytes > seg.size:
            raise ValueError(f"block [{offset}, {offset + nbytes}) lies outside segment {name}")
        return seg.view[offset:offset + nbytes]

    def _drop_gone(self) -> None:
        """Unmap the segments whose owners unlinked them (they hold no block anyone
        reads: an owner gives back only a wholly free segment)."""
        for name in list(self._segments):
            if not os.path.exists(os.path.join(SHM_DIR, name)):
                self._unmap(self._segments.pop(name))

    def _unmap(self, seg: Segment) -> None:
        if self.on_unmap is not None:
            self.on_unmap(seg.view)
        seg.close()

    def forget(self, prefix: str) -> None:
        """Drop mappings of a process that is gone (its segments were unlinked)."""
        with self._lock:
            for name in [n for n in self._segments if n.startswith(prefix)]:
                self._unmap(self._segments.pop(name))

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()


def remove_segments(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with `prefix`.

    Only the supervisor calls this, for a child that died without cleaning up after
    itself (SIGKILL, a crash), and once more at server exit as the last safety net.
    """
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
