"""Process lifecycle helpers every child process uses."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import shutil
import signal
import threading
import time

_PR_SET_PDEATHSIG = 1
_parent = 0  # the pid of the scheduler that started this process


def die_with_parent(sig: int = signal.SIGTERM, expected: int = 0) -> None:
    """Ask the kernel to send `sig` when the parent dies, and check it has not already.

    A child started by the scheduler must never outlive it: its arenas would stay in
    /dev/shm and its ports bound. `expected`: the parent's pid when known (the root
    may be pid 1 in a container, which otherwise reads as "re-parented to init").
    """
    global _parent
    parent = _parent = expected or os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent or (parent == 1 and not expected):
        os.kill(os.getpid(), sig)


# net allocations of tracked objects between two young collections (Python's default
# is 700); SHMSERVE_GC_YOUNG sets another, for measuring
GC_YOUNG_THRESHOLD = int(os.environ.get("SHMSERVE_GC_YOUNG", "5000"))
_log = logging.getLogger("shmserve.lifecycle")


def settle_heap(young: int = GC_YOUNG_THRESHOLD) -> int:
    """Take what the process built to start (modules, classes, functions: tens of
    thousands of objects it keeps for good) out of the cycle collector's sight, and
    let the collector wait for `young` net allocations instead of 700. Returns how many
    objects were set aside.

    Serving makes next to no cycles (a frontend under wrk, 64 connections: ~2,000
    objects freed that way in 27,000 requests), yet the collector ran every 700 net
    allocations, which the live requests' own objects (~1,600 at 64 connections) cross
    again and again, and traversed them all each time: 1,000 young collections of
    ~220 us in 6 s. One in ~120 was a full one that walked the 40,000 objects of the
    imports too, for 30-40 ms in which the process answered nobody. Together that was
    ~18 us of a frontend's ~165 per request and most of wrk's p99 (51-58 ms, 18-20 ms
    without). Refcounting frees what it freed before; what freeze() sets aside is never
    collected as a cycle, which is why this runs before the process makes anything it
    may later drop (a worker: before its first model)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
    frozen = gc.get_freeze_count()
    _log.debug("heap settled: %d objects set aside, young threshold %d", frozen, young)
    return frozen


def run_loop(main_coroutine):
    """Run a process's event loop to the end of `main_coroutine`: on uvloop where it is
    installed (a dependency on Linux), else asyncio's own. A frontend and the scheduler
    wake for a few microseconds of work per burst, and the stdlib loop's Python-level
    run-once and selector cost ~10 us of each wake-up (the scheduler's CPU per request
    at c=16, 5 alternated rounds: 41 against 51 us over HTTP, 36 against 46 gRPC)."""
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        import asyncio
        run = asyncio.run
    settle_heap()
    return run(main_coroutine)


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
_M_MMAP_THRESHOLD = -3
KEEP_HEAP_BYTES = 256 << 20


def keep_freed_heap(keep: int = KEEP_HEAP_BYTES) -> bool:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to
    the kernel at once. Returns whether the setting took (False off glibc, or when the
    user set MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ themselves).

    A frontend allocates and frees a request body's and a response's worth of memory
    per large request. By default a block over the mmap threshold is mapped fresh and
    unmapped on free, and a heap top over the trim threshold is returned, so the next
    request pays a page fault per 4 KiB touched and an munmap: 60% of a frontend's CPU
    for a 4 MiB gRPC message. With blocks up to glibc's largest mmap threshold (32 MiB)
    taken from the heap and up to `keep` bytes of free heap kept, those pages stay
    mapped; the cost is a frontend's RSS staying at its high-water mark (up to `keep`
    above its live data) after a burst of large requests."""
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(
        mallopt(_M_TRIM_THRESHOLD, keep))


def release_freed_heap() -> None:
    """Hand the free pages of the heap back to the kernel now (glibc's malloc_trim),
    whatever keep_freed_heap() keeps: for after a connection made the heap grow far
    past what normal traffic reuses (a peer that never opened its windows)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def parent_gone() -> bool:
    """True once the scheduler that started this process has died or is dying: a
    signal now means "orphaned", not "the scheduler asks us to stop".

    Dying counts: when the scheduler is killed, its threads exit one by one, and the
    kernel sends PDEATHSIG as soon as the thread that started us is gone, handing us
    to a thread still alive, so getppid() has not changed yet. The scheduler's main
    thread is a zombie by then. (A worker stopping gracefully on that signal left the
    socket directory behind: the orphans' cleanup below never ran.)"""
    if _parent == 0:
        return False
    if os.getppid() != _parent:
        return True
    try:
        with open(f"/proc/{_parent}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")


def watch_parent(segment_prefix: str, address: str = "", period: float = 1.0) -> None:
    """End this process once the scheduler that started it has been gone for two
    looks in a row (`period` apart), whatever its main thread is doing.

    PDEATHSIG only asks: a frontend handles that SIGTERM on its event loop, so a loop
    held by one request (a long parse) never heard it, and the orphan kept the server's
    ports and segments for minutes after the server was killed. A thread gets the GIL
    from such a loop at the interpreter's switch interval; the second look leaves the
    loop's own orphan handling its chance first."""
    def watch():
        missed = 0
        while True:
            time.sleep(period)
            missed = missed + 1 if parent_gone() else 0
            if missed >= 2:
                exit_orphaned(segment_prefix, address)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_orphaned(segment_prefix: str, address: str = "") -> None:
    """Leave at once after the scheduler died (kill -9: nobody else cleans up).

    A graceful stop would wait for the model running now (a thread may sleep for
    seconds) and answer a scheduler that is gone; instead remove this process's own
    segments and, as every orphan does, the scheduler's socket directory, then exit
    without running anything else. `segment_prefix` is the prefix the scheduler gave
    this process; `address` its ipc:// inbox address in the socket directory."""
    from shm.arena import remove_segments
    try:
        remove_segments(segment_prefix + "-")
        if address.startswith("ipc://"):
            shutil.rmtree(os.path.dirname(address[len("ipc://"):]), ignore_errors=True)
    finally:
        os._exit(1)


def exit_when_overdue(segment_prefix: str, seconds: float, role: str) -> threading.Timer:
    """Arm a stop's deadline: a process still here `seconds` from now removes its own
    segments and exits, whatever its event loop is doing (a client that never reads,
    a task that ignores its cancel). A stop is bounded by --exit-timeout-secs, not by
    the clients; a thread, not the loop, so a loop held by one request cannot miss it.
    Returns the timer (cancel it for a stop that ended in time)."""
    def overdue():
        try:
            logging.getLogger(f"shmserve.{role}").warning(
                "the stop overran its %.1fs (exit timeout); leaving now", seconds)
        finally:
            exit_orphaned(segment_prefix)

    timer = threading.Timer(seconds, overdue)
    timer.daemon = True
    timer.start()
    return timer


PROFILE_ENV = "SHMSERVE_CPROFILE"  # a folder: each process writes ROLE-PID.prof there


def run_main(main, role: str) -> None:
    """Run a process's `main()`, under cProfile when SHMSERVE_CPROFILE names a folder.

    A developer's tool beside py-spy (`scripts/bench --profile-role`): py-spy samples
    wall time, so on a busy 2-core machine a process waiting for a core shows as time
    in its last system call; cProfile counts the calls themselves, deterministically,
    for every process of one run. The profile is written when main() returns or
    raises SystemExit (a clean stop, SIGTERM included): read it with `python -m pstats`.
    """
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        main()
        return
    import cProfile
    profile = cProfile.Profile()
    try:
        profile.runcall(main)
    finally:
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{role}-{os.getpid()}.prof"))
