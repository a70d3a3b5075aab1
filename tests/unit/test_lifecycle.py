"""shm.lifecycle: a child never outlives the scheduler that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the grandchild: orphaned on purpose while its main thread spins in Python, as a
# frontend's event loop held by one long request did
_STUCK = textwrap.dedent("""
    import signal, sys
    from shm import lifecycle
    from shm.arena import Segment
    prefix = sys.argv[1]
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    lifecycle.die_with_parent(signal.SIGUSR2)  # the death signal itself does nothing
    Segment.create(prefix + "-0", 4096)
    lifecycle.watch_parent(prefix, period=0.05)
    print("ready", flush=True)
    n = 0
    while True:  # never returns to anything that would notice a signal
        n += 1
""")

# the middle process: starts the grandchild, says its pid, then dies
_PARENT = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_an_orphan_whose_thread_is_stuck_still_exits_and_removes_its_segments():
    prefix = f"shmserve-test-orphan-{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-c", _PARENT, _STUCK, prefix], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    pid = int(out.stdout.strip())
    try:
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the orphan kept running"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    finally:
        if _alive(pid):
            os.kill(pid, 9)
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))
