"""shm.lifecycle.keep_freed_heap: a frontend's large, short-lived buffers reuse the
pages freed by the last request instead of faulting fresh ones in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys
from shm.lifecycle import keep_freed_heap
took = keep_freed_heap() if sys.argv[1] == "keep" else None

def request():
    # a body, a decoded copy and a response alive at once, then all freed
    body = bytearray(b"b" * (4 << 20))
    body += b"x" * (1 << 20)
    out = b"o" * (6 << 20)
    return len(body) + len(out)

for _ in range(5):
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    request()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                         text=True, check=True, timeout=60, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_buffers_reuse_pages_once_the_heap_is_kept():
    took, kept = _faults("keep")
    _, default = _faults("default")
    assert took == "True"
    # 20 requests of ~15 MiB: by default most pages fault in again every time (~3,800
    # per request); kept, the pages of the first requests are reused
    assert kept < 20 * 100, kept
    assert default > 4 * kept, (default, kept)


def test_a_users_own_malloc_setting_is_left_alone(monkeypatch):
    from shm import lifecycle
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000")
    assert lifecycle.keep_freed_heap() is False
