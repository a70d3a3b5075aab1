"""What a server killed whole (kill -9 of its root and every child at once, an OOM
kill of the container's processes) leaves behind, removed by the next server.

Every other death is cleaned up by a survivor: the root after its scheduler, the
orphans after their scheduler (shm/lifecycle.exit_orphaned), the scheduler after a
child. When nobody survives, the segments stay in /dev/shm until reboot. So the
scheduler holds an exclusive flock on `lock` in its run directory, a file that also
names its segment prefix, for as long as it lives; the kernel drops the lock with the
last process that held it, however it died. A starting server sweeps every run
directory whose lock it can take: nobody lives there, so it removes the segments of
that prefix and the directory. The lock lives in the run directory, not in /dev/shm,
because the orphans already remove that directory: a lock file there never outlives
what it guards.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import tempfile

from shm.arena import remove_segments

log = logging.getLogger("shmserve.root")

LOCK = "lock"
RUN_DIR_PREFIX = "shmserve-"


def hold_run_dir(run_dir: str, prefix: str) -> int:
    """Lock `run_dir` for this process, naming `prefix` in it; the fd, kept open for
    the process's life (close it at a clean stop). The file is locked before it gets
    its name, so a sweeper never finds `lock` unlocked while its owner lives."""
    staging = os.path.join(run_dir, f".{LOCK}.{os.getpid()}")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, prefix.encode())
    os.rename(staging, os.path.join(run_dir, LOCK))
    return fd


def sweep(tmp_dir: str | None = None) -> list[str]:
    """Remove what dead servers left: for each run directory under `tmp_dir` whose
    lock nobody holds, its prefix's segments and the directory. The prefixes swept."""
    swept = []
    pattern = os.path.join(tmp_dir or tempfile.gettempdir(), f"{RUN_DIR_PREFIX}*", LOCK)
    for path in glob.glob(pattern):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile, or not ours to read
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its server lives
            prefix = os.read(fd, 256).decode(errors="replace")
            # only a prefix of ours: a file that says anything else is not trusted
            if prefix.startswith("shmserve-") and prefix.endswith("-") and "/" not in prefix:
                left = remove_segments(prefix)
                if left:
                    log.info("removed %d shared-memory segment(s) of a server that was "
                             "killed (%s*)", len(left), prefix)
                swept.append(prefix)
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        finally:
            os.close(fd)
    return swept
