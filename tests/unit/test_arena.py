import os

import numpy as np
import pytest

from shm.arena import ALIGN, Arena, SegmentCache, check_name, remove_segments


@pytest.fixture
def arena():
    a = Arena(f"shmserve-unittest-{os.getpid()}", chunk_size=1 << 20)
    yield a
    a.close()


def _on_disk(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def test_blocks_are_aligned_distinct_and_reused(arena):
    a = arena.alloc(100)
    b = arena.alloc(5000)
    assert a[1] % ALIGN == 0 and b[1] % ALIGN == 0
    assert a[1] + 100 <= b[1]
    assert len(a[2]) == 100 and len(b[2]) == 5000
    arena.free(a[0], a[1])
    c = arena.alloc(64)
    assert (c[0], c[1]) == (a[0], a[1])  # first fit takes the freed hole


def test_free_coalesces_neighbours(arena):
    blocks = [arena.alloc(ALIGN) for _ in range(3)]
    for seg, off, _ in blocks:
        arena.free(seg, off)
    # the three holes merged with the tail: one block spanning the whole chunk fits
    big = arena.alloc(arena.chunk_size)
    assert big[1] == 0 and len(arena.segments) == 1


def test_grows_by_segments_and_gives_large_requests_their_own(arena):
    arena.alloc(arena.chunk_size)  # fills chunk 0
    seg, off, view = arena.alloc(3 * arena.chunk_size)
    assert len(arena.segments) == 2
    assert arena.segments[seg].size >= 3 * arena.chunk_size
    assert len(view) == 3 * arena.chunk_size


def test_reader_sees_writer_bytes_in_place(arena):
    seg, off, view = arena.alloc(4096)
    view[:] = np.arange(1024, dtype=np.float32).tobytes()
    cache = SegmentCache()
    try:
        got = np.frombuffer(cache.view(seg, off, 4096), dtype=np.float32)
        np.testing.assert_array_equal(got, np.arange(1024, dtype=np.float32))
        view[:4] = np.float32(42).tobytes()  # same memory, not a copy
        assert got[0] == 42
        with pytest.raises(ValueError):
            cache.view(seg, arena.segments[seg].size - 10, 100)
    finally:
        cache.close()


def test_close_unlinks_every_segment(arena):
    arena.alloc(10)
    arena.alloc(5 * arena.chunk_size)
    assert len(_on_disk(arena.prefix)) == 2
    arena.close()
    assert _on_disk(arena.prefix) == []


def test_stale_free_is_ignored(arena):
    seg, off, _ = arena.alloc(10)
    arena.free(seg, off)
    arena.free(seg, off)  # a second release (e.g. replayed after a restart)
    arena.free("shmserve-nonexistent-0", 0)
    assert arena.used_bytes() == 0


def test_remove_segments_by_prefix(arena):
    arena.alloc(10)
    removed = remove_segments(arena.prefix + "-")
    assert removed == [f"{arena.prefix}-0"]
    assert _on_disk(arena.prefix) == []


@pytest.mark.parametrize("name", ["", "a/b", "..", "x\0y"])
def test_names_are_plain(name):
    with pytest.raises(ValueError):
        check_name(name)


# -- memory: reserved as bytes arrive, given back past the high-water mark ------------


def _allocated(name):
    """Bytes of memory a segment holds (tmpfs allocates a page when first written)."""
    return os.stat(f"/dev/shm/{name}").st_blocks * 512


def _mapped_rss(names):
    """{segment: resident bytes of this process's mapping of it (0 if unmapped)} for
    each of `names`, from one read of /proc/self/smaps: with torch loaded it lists
    thousands of mappings, and a read per segment cost ~20 ms of CPU."""
    total, inside = dict.fromkeys(names, 0), []
    with open("/proc/self/smaps") as f:
        for line in f:
            if not line[:1].isupper():  # a mapping's header line: range, perms, path
                path = line.rstrip().split(" ", 5)[-1].strip()
                inside = [n for n in names if path.startswith(f"/dev/shm/{n}")]
            elif inside and line.startswith("Rss:"):
                for name in inside:
                    total[name] += int(line.split()[1]) * 1024
    return total


def test_only_the_first_chunk_is_prefaulted_and_a_reservation_costs_no_memory(arena):
    floor, _, _ = arena.alloc(arena.chunk_size)
    assert _allocated(floor) == arena.chunk_size  # the warm floor
    seg, off, view = arena.alloc(arena.chunk_size)  # a second chunk, reserved
    big, _, big_view = arena.alloc(3 * arena.chunk_size)  # a segment of its own
    assert len({floor, seg, big}) == 3
    assert _allocated(seg) == 0 and _allocated(big) == 0  # nothing written: nothing held
    view[:1] = b"x"  # one byte arrives
    big_view[-1:] = b"y"
    assert _allocated(seg) == 4096 and _allocated(big) == 4096  # one page each


def test_free_segments_are_kept_for_reuse_under_the_high_water_mark():
    a = Arena(f"shmserve-unittest-{os.getpid()}-keep", chunk_size=1 << 20,
              high_water=3 << 20)
    try:
        blocks = [a.alloc(a.chunk_size) for _ in range(3)]  # 3 MiB: at the mark
        for seg, off, view in blocks:
            view[:] = b"w" * len(view)
            a.free(seg, off)
        assert len(_on_disk(a.prefix)) == 3 and a.capacity == 3 << 20
        again = a.alloc(a.chunk_size)  # reused, and still warm
        assert again[0] == blocks[0][0] and _allocated(blocks[1][0]) == a.chunk_size
    finally:
        a.close()


def test_a_free_segment_under_the_mark_goes_back_once_idle_long_enough():
    # what a burst (or an attacker) grew the arena by goes back seconds later, and a
    # segment reused meanwhile stays; the clock is the arena's idle_give_back
    a = Arena(f"shmserve-unittest-{os.getpid()}-idle", chunk_size=1 << 20,
              high_water=8 << 20, idle_give_back=3600.0)
    try:
        floor = a.alloc(a.chunk_size)
        burst = [a.alloc(a.chunk_size) for _ in range(3)]
        for seg, off, view in burst:
            view[:] = b"w" * len(view)
            a.free(seg, off)
        a.free(floor[0], floor[1])
        assert a.next_trim() > 3000  # idle, not yet due
        assert a.trim() == 0 and len(_on_disk(a.prefix)) == 4
        again = a.alloc(100)  # first fit: the floor, which is never idle
        assert again[0] == floor[0] and floor[0] not in a.idle
        reused = a.alloc(a.chunk_size)  # a burst segment, taken off the idle list
        assert reused[0] == burst[0][0] and reused[0] not in a.idle
        a.idle_give_back = 0.0  # their time is up
        assert a.next_trim() == 0.0
        assert a.trim() == 2 * a.chunk_size
        assert _on_disk(a.prefix) == sorted([floor[0], reused[0]])
        assert a.next_trim() is None
        a.free(reused[0], reused[1])
        assert a.trim() == a.chunk_size and _on_disk(a.prefix) == [floor[0]]
    finally:
        a.close()


def test_past_the_high_water_mark_a_wholly_free_segment_goes_back():
    a = Arena(f"shmserve-unittest-{os.getpid()}-give", chunk_size=1 << 20,
              high_water=2 << 20)
    cache = SegmentCache()
    try:
        blocks = [a.alloc(a.chunk_size) for _ in range(4)]
        blocks.append(a.alloc(3 * a.chunk_size))  # a segment of its own
        for seg, off, view in blocks:
            view[:] = b"w" * len(view)
        assert a.resident_bytes() == 7 << 20
        # a reader maps the last two and reads them whole: their pages must go even
        # while it still maps them
        for seg, off, view in blocks[3:]:
            assert bytes(cache.view(seg, off, len(view))) == b"w" * len(view)
        half = a.alloc(a.chunk_size // 2)  # keeps the segment it lies in busy
        for seg, off, _ in blocks:
            a.free(seg, off)
        # 8 MiB of segments against a 2 MiB mark: each segment that becomes wholly
        # free goes, but the floor and the one still in use (half) stay
        assert _on_disk(a.prefix) == sorted([blocks[0][0], half[0]])
        assert a.capacity == 2 << 20
        assert a.resident_bytes() == 1 << 20  # the floor: `half` was never written
        gone = [seg for seg, _, _ in blocks[1:]]
        # the reader's mappings of given-back segments hold no memory any more
        assert _mapped_rss(gone) == dict.fromkeys(gone, 0)
        # and the reader drops them when it next maps a segment
        unmapped = []
        cache.on_unmap = unmapped.append
        cache.view(half[0], half[1], 64)
        assert len(unmapped) == 2 and _mapped_rss(gone) == dict.fromkeys(gone, 0)
        assert sorted(cache._segments) == [half[0]]
    finally:
        cache.close()
        a.close()


def test_the_first_chunk_stays_whatever_the_mark():
    a = Arena(f"shmserve-unittest-{os.getpid()}-floor", chunk_size=1 << 20, high_water=0)
    try:
        seg, off, _ = a.alloc(100)
        other = a.alloc(a.chunk_size)
        a.free(seg, off)
        a.free(other[0], other[1])
        assert _on_disk(a.prefix) == [seg] and _allocated(seg) == a.chunk_size
    finally:
        a.close()


def test_an_oversized_first_block_is_no_floor():
    """A huge first request must not become a pre-faulted segment kept for ever."""
    a = Arena(f"shmserve-unittest-{os.getpid()}-big", chunk_size=1 << 20, high_water=0)
    try:
        seg, off, _ = a.alloc(8 << 20)
        assert _allocated(seg) == 0
        a.free(seg, off)
        assert _on_disk(a.prefix) == []
    finally:
        a.close()


def test_a_gpu_worker_unpins_what_it_gives_back_or_stops_mapping():
    """A GPU worker pins its own segments and those it maps: a segment given back is
    unpinned first (pinned pages would outlive it), on either side."""
    from shm.arena import address_of
    from shm.tensor import TensorRef, arena_blocks
    from workers.tensors import Copies, TensorIO, unpinner

    pinned, unpinned = {}, []

    def pin(view):
        pinned[address_of(view)] = len(view)
        return address_of(view)

    def unpin(address):
        del pinned[address]
        unpinned.append(address)

    prefix = f"shmserve-unittest-{os.getpid()}"
    outputs = Arena(f"{prefix}-w", chunk_size=1 << 20, high_water=0, on_segment=pin,
                    on_release=unpinner(unpin))
    inputs = Arena(f"{prefix}-f", chunk_size=1 << 20, high_water=0)  # a frontend's
    io = TensorIO(outputs, "ipc://w", pin, unpin)
    try:
        one = np.ones(1 << 18, np.float32)  # a chunk
        refs = io.write([("A", "FP32", one), ("B", "FP32", one)], None, "ipc://fe", Copies())
        assert len(pinned) == 2  # the floor and a second segment, both pinned
        io.released("ipc://fe", arena_blocks(refs))
        assert list(pinned.values()) == [1 << 20] and len(outputs.segments) == 1
        assert len(unpinned) == 1

        inputs.alloc(1 << 20)  # the frontend's floor, busy
        seg, off, view = inputs.alloc(1 << 20)
        io.input(TensorRef("X", "FP32", [1 << 18], segment=seg, offset=off,
                           nbytes=1 << 20))
        assert len(pinned) == 2  # mapped, so pinned
        given_back = address_of(io.segments._segments[seg].view)
        inputs.free(seg, off)  # given back by its owner
        seg2, off2, _ = inputs.alloc(1 << 20)
        io.input(TensorRef("X", "FP32", [1 << 18], segment=seg2, offset=off2,
                           nbytes=1 << 20))
        # the new one pinned, the one given back unpinned and unmapped
        assert unpinned[1:] == [given_back] and seg not in io.segments._segments
        assert len(pinned) == 2
    finally:
        io.close()
        outputs.close()
        inputs.close()
