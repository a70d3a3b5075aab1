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


# a process whose stop hangs in its main thread (spinning in Python, as a loop held
# by a client that never reads): the stop's deadline still ends it
_OVERDUE = textwrap.dedent("""
    import sys
    from shm import lifecycle
    from shm.arena import Segment
    prefix = sys.argv[1]
    Segment.create(prefix + "-0", 4096)
    lifecycle.exit_when_overdue(prefix, 0.1, "test")  # the spin until then is CPU
    n = 0
    while True:
        n += 1
""")


def test_a_stop_past_its_deadline_exits_and_removes_its_segments():
    """Rule: exit_when_overdue ends the process at its deadline, whatever its main
    thread does, and takes its own segments with it; a cancelled one does nothing."""
    prefix = f"shmserve-test-overdue-{uuid.uuid4().hex[:8]}"
    try:
        out = subprocess.run([sys.executable, "-c", _OVERDUE, prefix], cwd=ROOT,
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 1
        assert "the stop overran" in out.stderr
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        cancelled = subprocess.run(
            [sys.executable, "-c", "import time; from shm import lifecycle; "
             "t = lifecycle.exit_when_overdue('x', 0.2, 'test'); t.cancel(); "
             "time.sleep(0.5); print('lived')"],
            cwd=ROOT, capture_output=True, text=True, timeout=30,
            env={**os.environ, "PYTHONPATH": ROOT})
        assert cancelled.returncode == 0 and cancelled.stdout.strip() == "lived"
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))
