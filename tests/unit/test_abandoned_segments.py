"""A server killed together with its root leaves its segments; the next server to
start removes them (shm.arena.remove_abandoned), and nothing of a live server or of a
prefix nobody claimed."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

from shm.arena import SHM_DIR, claim_prefix, release_prefix, remove_abandoned

CHILD = """
import sys, time
from shm.arena import claim_prefix
claim_prefix(sys.argv[1])
open('/dev/shm/' + sys.argv[1] + 'w1-0', 'wb').close()
print('ready', flush=True)
time.sleep(60)
"""


def _prefix() -> str:
    return f"shmserve-{secrets.token_hex(4)}-"


def _left(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))


def test_segments_of_a_root_killed_by_sigkill_are_removed_and_no_one_elses():
    dead, live, unclaimed = _prefix(), _prefix(), _prefix()
    child = subprocess.Popen([sys.executable, "-c", CHILD, dead], stdout=subprocess.PIPE,
                             text=True, cwd=os.path.dirname(os.path.dirname(
                                 os.path.dirname(os.path.abspath(__file__)))))
    fd = None
    try:
        assert child.stdout.readline().strip() == "ready"
        assert _left(dead) == [dead + "lock", dead + "w1-0"]
        assert not set(remove_abandoned()) & {dead + "w1-0"}  # its holder lives
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        fd = claim_prefix(live)
        for prefix in (live, unclaimed):
            open(os.path.join(SHM_DIR, prefix + "f0g0-0"), "wb").close()
        removed = remove_abandoned()
        assert dead + "w1-0" in removed
        assert _left(dead) == []  # its segments and its lock file
        assert _left(live) == [live + "f0g0-0", live + "lock"]
        assert _left(unclaimed) == [unclaimed + "f0g0-0"]
    finally:
        child.kill()
        child.wait(10)
        if fd is not None:
            release_prefix(live, fd)
        for prefix in (dead, live, unclaimed):
            for name in _left(prefix):
                os.unlink(os.path.join(SHM_DIR, name))
