"""The scheduler's timerfd timer: it runs the callback no later than the earliest
deadline it was given, and is never disarmed or pushed later (an early callback
re-arms; a syscall per burst would cost more)."""

import asyncio
import time

from scheduler.timer import PreciseTimer


def _run(steps):
    async def main():
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()
        timer = PreciseTimer(loop, fired.set)
        try:
            return await steps(timer, fired)
        finally:
            timer.close()
    return asyncio.run(asyncio.wait_for(main(), 10))


def test_a_later_deadline_or_none_keeps_the_earlier_one_armed():
    async def steps(timer, fired):
        soon = time.monotonic_ns() + 20_000_000
        timer.set(soon)
        timer.set(soon + 60_000_000_000)  # a minute later: ignored
        timer.set(None)                   # nothing due: still armed
        assert timer.deadline == soon
        await fired.wait()
        assert time.monotonic_ns() >= soon
        assert timer.deadline is None     # fired: the next set arms again
    _run(steps)


def test_an_earlier_deadline_moves_it():
    async def steps(timer, fired):
        now = time.monotonic_ns()
        timer.set(now + 60_000_000_000)
        timer.set(now + 10_000_000)
        assert timer.deadline == now + 10_000_000
        await fired.wait()
    _run(steps)
