"""Starting, watching and stopping child processes.

Children are fresh interpreters (`python -m frontend.main` / `workers.main`), never
forks, in their own session so a terminal's Ctrl-C reaches only the scheduler, which
then stops them in order. Each child is watched through a pidfd on the event loop: its
exit is seen the moment it happens, whatever killed it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import Callable

log = logging.getLogger("shmserve.supervisor")


class Child:
    """One supervised process. `on_exit(child, returncode)` runs on the loop."""

    def __init__(self, name: str, module: str, args: list[str],
                 on_exit: Callable[["Child", int], None], executable: str = "",
                 env: dict[str, str] | None = None):
        self.name = name
        # another interpreter: a python model's EXECUTION_ENV_PATH
        # (scheduler/processes/exec_env.py)
        self.argv = [executable or sys.executable, "-m", module, *args]
        self.env = env
        self.on_exit = on_exit
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.exited = asyncio.Event()
        self._pidfd = -1

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=self.env,
                                     start_new_session=True, close_fds=True)
        self._pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self._pidfd, self._reap, loop)
        log.debug("started %s (pid %d)", self.name, self.proc.pid)

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        self.returncode = self.proc.wait()
        self.exited.set()
        self.on_exit(self, self.returncode)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.returncode is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float) -> None:
        """SIGTERM, a bounded wait, then SIGKILL."""
        if self.proc is None or self.returncode is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.exited.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("%s did not stop in %.1fs; killing it", self.name, timeout)
            self.signal(signal.SIGKILL)
            await self.exited.wait()

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.exited.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
