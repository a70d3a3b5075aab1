"""Triton's test hooks that hold a scheduler until enough requests are queued.

Triton's qa tests (L0_batcher, L0_sequence_batcher, ...) prove batch formation exactly,
not by timing: the server is started with

- ``TRITONSERVER_DELAY_SCHEDULER=N``: no batch forms until N requests are queued. The
  dynamic batcher counts its whole queue (every priority level); the sequence batcher
  counts the requests queued in the sequence slots of all its instances together.
- ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M``: sequence batcher only. Once the count
  above is reached, it also waits until M requests sit in the backlog (sequences that
  found no free slot). Triton checks it only while the first hook holds, so it does
  nothing without ``TRITONSERVER_DELAY_SCHEDULER``; L0_sequence_batcher sets it to 0
  beside ``TRITONSERVER_DELAY_SCHEDULER=12`` for the same reason.

Either hold ends once, for good: after the first batch goes, the scheduler runs as
usual. The values are read as C's ``atoi`` reads them (leading digits, anything else
is 0), except that a negative value is 0: Triton stores it in a ``size_t`` and would
wait forever.
"""

from __future__ import annotations

import os
import re

DELAY_SCHEDULER_ENV = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_SCHEDULER_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"

_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


def _atoi(text: str | None) -> int:
    match = _LEADING_INT.match(text or "")
    return max(0, int(match.group(1))) if match else 0


class SchedulerHold:
    """The hold one scheduler is under; pure state, no clock."""

    __slots__ = ("queued", "backlog")

    def __init__(self, queued: int = 0, backlog: int = 0) -> None:
        self.queued = max(0, int(queued))  # TRITONSERVER_DELAY_SCHEDULER
        self.backlog = max(0, int(backlog))  # TRITONSERVER_BACKLOG_DELAY_SCHEDULER

    @classmethod
    def from_env(cls, environ=None) -> "SchedulerHold":
        environ = os.environ if environ is None else environ
        return cls(_atoi(environ.get(DELAY_SCHEDULER_ENV)),
                   _atoi(environ.get(BACKLOG_DELAY_SCHEDULER_ENV)))

    @property
    def active(self) -> bool:
        return self.queued > 0

    def holding(self, queued: int, backlog: int = 0) -> bool:
        """True while no batch may form, given the requests queued (and, for the
        sequence batcher, those in its backlog). Once it answers False it is over."""
        if not self.queued:
            return False
        if queued < self.queued or (self.backlog and backlog < self.backlog):
            return True
        self.queued = self.backlog = 0
        return False
