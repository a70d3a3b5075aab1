"""shm/cuda_fake.py's device memory lives as long as its process, as a real device's
does: what a process did not free is gone after it exits, and what a killed process
left is removed by the next process that allocates."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def lifetimes():
    """A process killed while it holds an allocation, then a next one that allocates
    and exits: what /dev/shm held of each at each point. One run for both tests (each
    process is an interpreter importing numpy, ~0.25 s of CPU)."""
    seen = {}
    killed = _run("sys.stdin and __import__('time').sleep(60)")
    pid = int(killed.stdout.readline())
    seen["killed, while it lives"] = _objects(pid)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    seen["killed, after the kill"] = _objects(pid)
    nxt = _run("sys.exit(0)")
    nxt_pid = int(nxt.stdout.readline())
    seen["next exit status"] = nxt.wait(30)
    seen["killed, after the next allocation"] = _objects(pid)
    seen["next, after its exit"] = _objects(nxt_pid)
    return seen


def test_what_a_process_did_not_free_is_gone_after_its_exit(lifetimes):
    assert lifetimes["next exit status"] == 0
    assert lifetimes["next, after its exit"] == []


def test_what_a_killed_process_left_is_removed_by_the_next_allocation(lifetimes):
    assert lifetimes["killed, while it lives"], "the allocation exists while its process lives"
    assert lifetimes["killed, after the kill"], "a kill -9 runs no exit handler"
    assert lifetimes["next exit status"] == 0
    assert lifetimes["killed, after the next allocation"] == []
