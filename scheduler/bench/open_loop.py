"""The open loop of scripts/bench (`--request-rate`): requests leave on a fixed
schedule, whatever the server answers, so the latency under a given arrival rate shows,
queueing included. Latency is measured from the scheduled send time, not the actual one:
a client that falls behind (every slot busy, or the event loop late) adds to latency as
a real arrival would, and the late sends are counted. A client module, never imported
by the server's processes.
"""

from __future__ import annotations

import asyncio
import random
import time

LATE_S = 0.001  # a send this much after its scheduled time counts as late


def send_times(rate: float, distribution: str, start: float, end: float,
               seed: int = 0, phase: float = 0.0) -> list[float]:
    """Scheduled send times in [start, end) for `rate` requests/s: evenly spaced
    (`constant`, shifted by `phase` seconds) or with exponential gaps (`poisson`,
    seeded: the same seed gives the same schedule)."""
    if rate <= 0:
        raise ValueError(f"request rate must be positive: {rate}")
    out: list[float] = []
    if distribution == "constant":
        k = 0
        while (t := start + phase + k / rate) < end:
            out.append(t)
            k += 1
    elif distribution == "poisson":
        rng = random.Random(seed)
        t = start + phase + rng.expovariate(rate)
        while t < end:
            out.append(t)
            t += rng.expovariate(rate)
    else:
        raise ValueError(f"unknown request distribution {distribution!r}")
    return out


class Pacer:
    """Walks a schedule against a clock the caller reads: how long to wait for the
    next send, which scheduled time a send takes, how many went out late and how many
    of those inside [window_start, window_end) never went out."""

    def __init__(self, times: list[float], window_start: float, window_end: float,
                 late_after: float = LATE_S):
        self.times = times
        self.i = 0
        self.window = (window_start, window_end)
        self.late_after = late_after
        self.late = 0  # in-window sends that left late

    def wait(self, now: float) -> float | None:
        """Seconds until the next send is due (<= 0: due now); None: schedule done."""
        if self.i >= len(self.times):
            return None
        return self.times[self.i] - now

    def peek(self) -> float:
        """The next send's scheduled time."""
        return self.times[self.i]

    def take(self, now: float) -> float:
        """The next send leaves now: its scheduled time (what latency counts from)."""
        t = self.times[self.i]
        self.i += 1
        if self.window[0] <= t < self.window[1] and now - t > self.late_after:
            self.late += 1
        return t

    def unsent(self) -> int:
        """Scheduled inside the window but not sent (the client could not keep up)."""
        lo, hi = self.window
        return sum(1 for t in self.times[self.i:] if lo <= t < hi)


async def run_open_loop(streams, infer, rec, times: list[float], clock=time.perf_counter):
    """Send on `times` through `infer(stream) -> awaitable result`, each request on a
    free stream of `streams` (a stream holds one request's tensors and shm regions, so
    their number caps the requests in flight: when all are busy the next send waits and
    is late). `rec` (bench.Recorder) records; its window decides what counts."""
    free: asyncio.Queue = asyncio.Queue()
    for s in streams:
        free.put_nowait(s)
    pacer = Pacer(times, rec.start, rec.deadline)
    tasks: set = set()

    async def one(stream, t_sched):
        try:
            stream.prepare()
            result = await infer(stream)
        except Exception as e:
            rec.error(e)
        else:
            rec.done(t_sched, stream.check(result))
        finally:
            free.put_nowait(stream)

    while (wait := pacer.wait(clock())) is not None:
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        stream = await free.get()
        if not rec.next(pacer.peek()):  # past the window, out of budget, or stopped
            free.put_nowait(stream)
            break
        task = asyncio.create_task(one(stream, pacer.take(clock())))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    rec.late += pacer.late
    rec.unsent += pacer.unsent()
