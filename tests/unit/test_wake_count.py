"""scripts/wake_count.py's counters, read from this process's own /proc entries, and
the per-request rows they make (the kernel's share of each role's CPU)."""

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import wake_count  # noqa: E402


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_every_thread_of_the_process_is_counted():
    pid = os.getpid()
    vol0, _ = wake_count.switches(pid)
    ns0 = wake_count.cpu_ns(pid)
    user0, sys0 = wake_count.user_sys(pid)
    done, leave = threading.Event(), threading.Event()

    def sleeper():  # a thread that sleeps and wakes: voluntary switches of its own
        for _ in range(20):
            time.sleep(0.001)
        _spin(0.05)
        done.set()
        leave.wait(10)  # still there when read: a thread gone takes its counts along

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        assert done.wait(10)
        vol1, _ = wake_count.switches(pid)
        assert vol1 - vol0 >= 20
        assert wake_count.cpu_ns(pid) - ns0 >= 40_000_000  # the thread's 50 ms spin
        user1, sys1 = wake_count.user_sys(pid)
        assert user1 >= user0 and sys1 >= sys0 and user1 + sys1 > user0 + sys0
    finally:
        leave.set()
        thread.join(10)


def test_rows_are_per_request_with_the_kernels_share():
    roles = {1: "frontend", 2: "worker", 3: "worker"}
    before = {1: (0, 0, 0.0, 0.0, 0.0), 2: (0, 0, 0.0, 0.0, 0.0), 3: (5, 1, 1.0, 1.0, 0.0)}
    after = {1: (200, 2, 0.03, 0.02, 0.01), 2: (100, 0, 0.01, 0.01, 0.0),
             3: (105, 1, 1.01, 1.01, 0.01)}
    rows = wake_count.per_role(roles, before, after, 100)
    assert rows["frontend"] == [2.0, 0.02, 300.0, 100 * 0.01 / 0.03]
    v, i, cpu, system = rows["worker"]  # both workers summed
    assert (v, i) == (2.0, 0.0) and round(cpu, 6) == 200.0
    assert round(system, 6) == round(100 * 0.01 / 0.03, 6)
    # a process gone before the second sample is left out, not counted as zero
    assert wake_count.per_role({4: "gone"}, {4: before[1]}, {}, 10) == {}
