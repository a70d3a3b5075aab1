"""The root process `shmserve` starts: it keeps one scheduler process alive.

It does nothing else. It starts the scheduler (`python -m scheduler.main`, told by
SUPERVISED_ENV that it is the supervised one), forwards SIGINT/SIGTERM to it, and exits
with its status when it stops. A scheduler that dies by a signal (kill -9, a crash in
native code) while no stop was asked for is restarted, with a backoff and at most
MAX_RESTARTS in RESTART_WINDOW_S, so a server that cannot stay up does not spin.

Why it is safe to start a fresh scheduler at once: this process is a child subreaper,
so the dead scheduler's children (frontends, workers) are re-parented here. They exit
as soon as their parent dies (PDEATHSIG); the root reaps every one of them (SIGKILL
after ORPHAN_DEADLINE_S) before the next start, which guarantees that no old
frontend still listens on the ports the new one claims, and then removes whatever the
dead generation left in /dev/shm (every name starts with that generation's prefix) and
its socket directory.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time

from scheduler.processes import leftovers
from shm.arena import remove_segments

log = logging.getLogger("shmserve.root")

SUPERVISED_ENV = "SHMSERVE_SUPERVISED"  # JSON: the scheduler's prefix, run dir, generation
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
BACKOFF_S = (0.0, 0.25, 0.5, 1.0, 2.0)  # before the 1st, 2nd, ... restart in a window
ORPHAN_DEADLINE_S = 5.0
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # forwarded to the scheduler
_PR_SET_CHILD_SUBREAPER = 36


def backoff(recent: int) -> float:
    """The pause before a restart when `recent` restarts happened in the window."""
    return BACKOFF_S[min(recent, len(BACKOFF_S) - 1)]


class RestartBudget:
    """At most `limit` restarts in `window` seconds; the clock is injected for tests."""

    def __init__(self, limit: int = MAX_RESTARTS, window: float = RESTART_WINDOW_S,
                 clock=time.monotonic):
        self.limit, self.window, self.clock = limit, window, clock
        self.times: list[float] = []

    def recent(self) -> int:
        now = self.clock()
        self.times = [t for t in self.times if now - t < self.window]
        return len(self.times)

    def take(self) -> bool:
        if self.recent() >= self.limit:
            return False
        self.times.append(self.clock())
        return True


def should_restart(status: int, stopping: bool) -> bool:
    """A scheduler is restarted only when it was killed by a signal nobody asked for.
    An exit status is its own decision (0: stopped; 1: a port in use, models that
    failed under --exit-on-error, ...): starting it again would fail the same way."""
    return status < 0 and not stopping


class Root:
    def __init__(self, argv: list[str], stop_grace: float = 90.0):
        self.argv = argv
        # a scheduler that has not stopped this long after a stop signal is killed (it
        # bounds its own drain by --exit-timeout-secs; this is the backstop)
        self.stop_grace = stop_grace
        self.pid = 0  # the scheduler now running
        self.stopping = False
        self.budget = RestartBudget()
        self.generation = 0
        # outlives every scheduler generation: what one must tell the next (the
        # repository API's calls, scheduler/repository/journal.py); removed at exit
        self.state_dir = ""

    # -- signals ------------------------------------------------------------------------

    def _on_signal(self, sig, _frame) -> None:
        if not self.stopping:
            log.info("%s: stopping the scheduler", signal.Signals(sig).name)
            signal.setitimer(signal.ITIMER_REAL, self.stop_grace)
        self.stopping = True
        if self.pid:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    # -- one scheduler ------------------------------------------------------------------

    def _start(self) -> tuple[str, str]:
        prefix = f"shmserve-{os.getpid():x}{secrets.token_hex(2)}-"
        run_dir = tempfile.mkdtemp(prefix="shmserve-")
        env = dict(os.environ)
        env[SUPERVISED_ENV] = json.dumps({"prefix": prefix, "run_dir": run_dir,
                                          "generation": self.generation,
                                          "state_dir": self.state_dir,
                                          "root": os.getpid()})
        argv = [sys.executable, "-m", "scheduler.main", *self.argv]
        # stop signals blocked until the scheduler can take them (scheduler/main.py):
        # a stop sent while it starts is then a clean stop, never a death by signal
        self.pid = os.posix_spawn(sys.executable, argv, env, setsigmask=STOP_SIGNALS)
        if self.stopping:  # a signal came while it was being started
            os.kill(self.pid, signal.SIGTERM)
        return prefix, run_dir

    def _wait_scheduler(self) -> int:
        """Reap until the scheduler itself exits (orphans of an earlier generation
        may be reaped on the way); its exit code, negative for a signal."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return 1
            if pid == self.pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)

    def _reap_orphans(self) -> None:
        """Wait for the dead scheduler's children, re-parented here, to exit; kill
        those still there after ORPHAN_DEADLINE_S."""
        deadline = time.monotonic() + ORPHAN_DEADLINE_S
        killed = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # none left
            if pid:
                continue
            if not killed and time.monotonic() > deadline:
                for child in _children(os.getpid()):
                    log.warning("process %d did not exit with its scheduler; killing it",
                                child)
                    try:
                        os.kill(child, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed = True
            time.sleep(0.01)

    def _on_stop_overdue(self, _sig, _frame) -> None:
        if self.pid:
            log.error("the scheduler did not stop within %.0fs; killing it",
                      self.stop_grace)
            os.kill(self.pid, signal.SIGKILL)

    def run(self) -> int:
        leftovers.sweep()  # what servers killed whole left in /dev/shm
        self.state_dir = tempfile.mkdtemp(prefix="shmserve-state-")
        try:
            return self._run()
        finally:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _run(self) -> int:
        _become_subreaper()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_stop_overdue)
        while True:
            prefix, run_dir = self._start()
            status = self._wait_scheduler()
            self._reap_orphans()
            left = remove_segments(prefix)
            shutil.rmtree(run_dir, ignore_errors=True)
            if not should_restart(status, self.stopping):
                break
            if left:
                log.info("removed %d shared-memory segment(s) of the dead scheduler",
                         len(left))
            how = f"killed by {_signame(-status)}"
            recent = self.budget.recent()
            if not self.budget.take():
                log.error("scheduler %s; it died %d times in %.0fs: not restarting it",
                          how, recent, RESTART_WINDOW_S)
                return 1
            pause = backoff(recent)
            log.error("scheduler %s; restarting it%s", how,
                      f" in {pause:.2f}s" if pause else "")
            if _pause(pause, lambda: self.stopping):
                return 0  # asked to stop while no scheduler ran: nothing to drain
            self.generation += 1
        # a signal's death is reported as a shell does (128 + signal number)
        return status if status >= 0 else 128 - status


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _pause(seconds: float, stop) -> bool:
    """Sleep `seconds` unless `stop()` turns true; returns stop()."""
    end = time.monotonic() + seconds
    while not stop() and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))
    return stop()


def _children(ppid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == ppid:
            found.append(int(entry))
    return found


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # orphans then go to init; they still exit on their own (PDEATHSIG)


def supervised() -> dict | None:
    """In the scheduler process: what its root gave it (prefix, run_dir, generation),
    taken out of the environment so that its own children do not inherit the role."""
    raw = os.environ.pop(SUPERVISED_ENV, None)
    return json.loads(raw) if raw else None
