"""A one-shot timer with microsecond resolution for the event loop.

asyncio's call_at sleeps in epoll's millisecond steps, and a batcher with
`max_queue_delay_microseconds: 100` would then wait ten times too long. A timerfd
armed in nanoseconds wakes epoll when it fires.
"""

from __future__ import annotations

import asyncio
import ctypes
import os

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)


class PreciseTimer:
    """Calls `callback()` from the loop at an absolute time.monotonic_ns() deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback):
        self._callback = callback
        self._fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._deadline: int | None = None
        self._loop = loop
        loop.add_reader(self._fd, self._fired)

    @property
    def deadline(self) -> int | None:
        return self._deadline

    def set(self, deadline_ns: int | None) -> None:
        """Make sure `callback()` runs no later than `deadline_ns` (CLOCK_MONOTONIC ns;
        None: no deadline). It may run earlier, at a deadline armed before: the timer is
        never disarmed or pushed later, because the loop asks after every burst and a
        timerfd_settime call each time costs more than the rare early wake-up, whose
        callback then arms the right time."""
        if deadline_ns is None:
            return
        if self._deadline is not None and self._deadline <= deadline_ns:
            return
        self._arm(deadline_ns)

    def _arm(self, deadline_ns: int) -> None:
        self._deadline = deadline_ns
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(deadline_ns, 1),
                                                             1_000_000_000)
        if _libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        self._deadline = None
        self._callback()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


