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
