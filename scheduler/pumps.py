"""When each model scheduler runs: once after a burst of messages that touched it
(it is marked dirty), and again at its batching deadline (one precise timer for the
earliest). Only a scheduler that was pumped can have a new deadline: every event that
could move one earlier (a request, a finished batch, an instance back) marks its
scheduler dirty.
"""

from __future__ import annotations

from scheduler.scheduling.interface import InstanceScheduler


class Pumps:
    def __init__(self, timer, clock):
        self.timer = timer  # PreciseTimer's interface: set(deadline_ns), close()
        self.clock = clock
        # marked by the handlers and the callbacks (pump_soon), emptied in place
        self.dirty: set[InstanceScheduler] = set()
        self.deadlines: dict[InstanceScheduler, int] = {}  # when each must run again
        self.waiting: set[InstanceScheduler] = set()  # pumped with requests still queued

    def run_dirty(self) -> None:
        if self.dirty:
            now = self.clock()
            dirty = tuple(self.dirty)
            self.dirty.clear()
            for sched in dirty:
                self._pump(sched, now)
            self._arm()

    def run_due(self) -> None:
        """The timer fired: run every scheduler whose deadline has come."""
        now = self.clock()
        for sched, deadline in list(self.deadlines.items()):
            if deadline <= now:
                self._pump(sched, now)
        self._arm()

    def any_waiting(self) -> bool:
        """Whether a scheduler still holds requests it could not place: they wait for
        an instance, or for resources an instance holds."""
        waiting = self.waiting
        if waiting:
            waiting.difference_update([s for s in waiting if not s.pending])
        return bool(waiting)

    def _pump(self, sched: InstanceScheduler, now: int) -> None:
        sched.pump(now)
        if sched.pending:
            self.waiting.add(sched)
        deadline = sched.next_deadline()
        if deadline is None:
            self.deadlines.pop(sched, None)
        else:
            self.deadlines[sched] = deadline

    def _arm(self) -> None:
        if self.deadlines:
            self.timer.set(min(self.deadlines.values()))
