"""scheduler/processes/leftovers.py: a run directory whose lock nobody holds is swept
(its prefix's segments and the directory); one whose lock is held is not."""

import os
import secrets

from scheduler.processes import leftovers
from shm.arena import SHM_DIR


def _segment(name: str) -> str:
    path = os.path.join(SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_only_run_directories_whose_lock_is_free_are_swept(tmp_path):
    dead_prefix = f"shmserve-test{secrets.token_hex(4)}-"
    live_prefix = f"shmserve-test{secrets.token_hex(4)}-"
    dead_dir, live_dir = tmp_path / "shmserve-dead", tmp_path / "shmserve-live"
    dead_dir.mkdir(), live_dir.mkdir()
    stray = tmp_path / "shmserve-nolock"  # a server between mkdtemp and its lock
    stray.mkdir()
    dead_seg, live_seg = _segment(dead_prefix + "w0-1"), _segment(live_prefix + "w0-1")
    try:
        os.close(leftovers.hold_run_dir(str(dead_dir), dead_prefix))  # its owner died
        live_fd = leftovers.hold_run_dir(str(live_dir), live_prefix)
        assert sorted(os.listdir(live_dir)) == ["lock"]  # the staging name is gone
        assert leftovers.sweep(str(tmp_path)) == [dead_prefix]
        assert not os.path.exists(dead_seg) and not dead_dir.exists()
        assert os.path.exists(live_seg) and live_dir.exists() and stray.exists()
        os.close(live_fd)
        assert leftovers.sweep(str(tmp_path)) == [live_prefix]
        assert not os.path.exists(live_seg)
    finally:
        for path in (dead_seg, live_seg):
            if os.path.exists(path):
                os.unlink(path)


def test_a_lock_that_names_no_prefix_of_ours_removes_no_segment(tmp_path):
    """The lock file's text chooses what is unlinked: anything but a shmserve prefix
    (an empty file, a path) removes the directory only."""
    run_dir = tmp_path / "shmserve-odd"
    run_dir.mkdir()
    (run_dir / "lock").write_text("")
    assert leftovers.sweep(str(tmp_path)) == []
    assert not run_dir.exists()
