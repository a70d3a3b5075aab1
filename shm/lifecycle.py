"""Process lifecycle helpers every child process uses."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` when the parent dies, and check it has not already.

    A child started by the scheduler must never outlive it: its arenas would stay in
    /dev/shm and its ports bound.
    """
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), sig)
