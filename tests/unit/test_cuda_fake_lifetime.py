"""shm/cuda_fake.py's device memory lives as long as its process, as a real device's
does: what a process did not free is gone after it exits, and what a killed process
left is removed by the next process that allocates."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOC = ("import os, sys; os.environ['SHMSERVE_FAKE_CUDA'] = '1'; "
         "from shm import cuda_fake; rt = cuda_fake._Runtime(); rt.malloc(64); "
         "print(os.getpid(), flush=True); {end}")


def _objects(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve-fakecuda-{pid}-")]


def _run(end: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ALLOC.format(end=end)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)


def test_what_a_process_did_not_free_is_gone_after_its_exit():
    proc = _run("sys.exit(0)")
    pid = int(proc.stdout.readline())
    assert proc.wait(30) == 0
    assert _objects(pid) == []


def test_what_a_killed_process_left_is_removed_by_the_next_allocation():
    proc = _run("sys.stdin and __import__('time').sleep(60)")
    pid = int(proc.stdout.readline())
    assert _objects(pid), "the allocation exists while its process lives"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert _objects(pid), "a kill -9 runs no exit handler"
    nxt = _run("sys.exit(0)")
    int(nxt.stdout.readline())
    assert nxt.wait(30) == 0
    assert _objects(pid) == []
