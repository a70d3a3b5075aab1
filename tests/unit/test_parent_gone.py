"""shm.lifecycle.parent_gone: a child of a scheduler that is being killed takes the
orphan's way out (its cleanup removes the socket directory), even while getppid()
still names the dying scheduler."""

import os
import time

from shm import lifecycle


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0]


def test_a_live_parent_is_not_gone(monkeypatch):
    me = os.getpid()
    monkeypatch.setattr(lifecycle, "_parent", me)
    monkeypatch.setattr(os, "getppid", lambda: me)
    assert not lifecycle.parent_gone()


def test_a_parent_that_changed_is_gone(monkeypatch):
    monkeypatch.setattr(lifecycle, "_parent", os.getppid() + 1)
    assert lifecycle.parent_gone()


def test_a_dying_parent_still_named_by_getppid_is_gone(monkeypatch):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while _state(pid) != b"Z":  # exited, not reaped: what a dying leader looks like
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        monkeypatch.setattr(lifecycle, "_parent", pid)
        monkeypatch.setattr(os, "getppid", lambda: pid)
        assert lifecycle.parent_gone()
    finally:
        os.waitpid(pid, 0)


def test_without_a_recorded_parent_nothing_is_gone(monkeypatch):
    monkeypatch.setattr(lifecycle, "_parent", 0)
    assert not lifecycle.parent_gone()
