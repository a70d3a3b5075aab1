"""frontend.dataplane.ResponseStream: a decoupled request's responses wait for their
reader, within bounds. A reader that keeps up, or lags by a few, is given every
response; one that reads none of them has its request cancelled once UNREAD_MAX
responses or UNREAD_BYTES_MAX arena bytes wait, and gets one final error instead."""

import asyncio
from types import SimpleNamespace

import pytest

from frontend import dataplane
from frontend.dataplane import ResponseStream
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest
from shm.messages.results import InferResponse, ReleaseBlocks
from shm.tensor import TensorRef

pytestmark = pytest.mark.timeout(30)


class Core:
    """What a ResponseStream asks of the data plane: the loop, the outbox (recorded),
    the pending table, and results built from responses."""

    def __init__(self, loop):
        self.sent = []
        self.outbox = SimpleNamespace(loop=loop, send=lambda to, m: self.sent.append(m))
        self.scheduler, self.address = "sched", "fe"
        self.pending = {}
        self.laggards = dataplane.Laggards()
        self.waiting = 0

    def _release_unclaimed(self, msg):
        dataplane.SchedulerDataPlane._release_unclaimed(self, msg)

    def _result(self, view, request, msg):
        return msg.outputs[0].offset  # which response it was

    def released(self) -> int:
        return sum(len(m.blocks) for m in self.sent if isinstance(m, ReleaseBlocks))


def response(k: int, nbytes: int = 4, final: bool = False) -> InferResponse:
    return InferResponse(1, [TensorRef("OUT", "INT32", [1], segment="seg", offset=k,
                                       nbytes=nbytes)], final=final, owner="worker")


def stream(core) -> ResponseStream:
    s = ResponseStream(core, 1, SimpleNamespace(name="repeat"), SimpleNamespace(id="r"),
                       [], None)
    core.pending[1] = s
    return s


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(dataplane, "_now", c)
    return c


def test_a_reader_that_takes_nothing_gets_its_request_cancelled_and_one_error(clock):
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        for k in range(dataplane.UNREAD_MAX + 1):
            s._deliver(response(k))
        clock.t += dataplane.UNREAD_STALL - 0.1
        s._deliver(response(10**6))  # as many waiting, but not yet for long
        assert core.released() == 0
        clock.t += 0.2
        s._deliver(response(10**6 + 1))  # waiting past UNREAD_STALL: given up
        assert core.released() == dataplane.UNREAD_MAX + 3
        assert [m for m in core.sent if isinstance(m, CancelRequest)] == [
            CancelRequest(1, "fe")]
        result, final = await s.next()
        assert isinstance(result, InferError) and final
        assert result.code == ErrorCode.UNAVAILABLE
        assert result.message.startswith(f"{dataplane.UNREAD_MAX + 2} responses (")
        assert "read none of them for 5 s" in result.message
        s._deliver(response(7))  # what the model still sends is released unread
        assert core.released() == dataplane.UNREAD_MAX + 4 and core.waiting == 0
        s.cancel()  # the transport's own cancel after that sends nothing more
        assert sum(isinstance(m, CancelRequest) for m in core.sent) == 1

    asyncio.run(main())


def test_a_stalled_reader_is_given_up_when_its_model_sends_no_more(clock):
    """The model sent all it had within the stall, then nothing: the once-a-second
    look at the laggards gives the request up all the same."""
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        for k in range(dataplane.UNREAD_MAX + 5):
            s._deliver(response(k))
        assert core.laggards.streams == {s} and core.laggards.timer is not None
        core.laggards.sweep()  # not yet stalled: kept, looked at again
        assert not s.closed and core.laggards.timer is not None
        clock.t += dataplane.UNREAD_STALL + 0.1
        core.laggards.sweep()
        assert s.closed and not core.laggards.streams and core.laggards.timer is None
        assert core.released() == dataplane.UNREAD_MAX + 5
        result, final = await s.next()
        assert final and dataplane.STALLED in result.message

    asyncio.run(main())


def test_the_stall_counts_from_when_responses_began_to_wait(clock):
    """A model that thinks for a minute before its first response: the reader had
    nothing to take meanwhile, so a burst after it is not judged a stall."""
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        clock.t += 60
        for k in range(dataplane.UNREAD_MAX + 10):
            s._deliver(response(k))
        assert not s.closed and core.released() == 0

    asyncio.run(main())


def test_a_slow_reader_is_not_cut_off_until_the_hard_bound(clock, monkeypatch):
    monkeypatch.setattr(dataplane, "UNREAD_MAX", 50)
    monkeypatch.setattr(dataplane, "UNREAD_HARD_MAX", 2000)

    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        taken = 0
        for k in range(4500):  # three in for every one taken, a second apart
            s._deliver(response(k))
            if s.closed:
                break
            if k % 3 == 2:
                clock.t += 1.0
                assert (await s.next())[0] == taken
                taken += 1
        # far past UNREAD_MAX, but taking one a second all along: cut off only once
        # UNREAD_HARD_MAX wait (about 3,000 in, 1,000 taken)
        assert s.closed and 2990 < k < 3010 and 990 < taken < 1010
        result, final = await s.next()
        assert final and "reads too slowly" in result.message

    asyncio.run(main())


def test_slow_readers_together_are_bounded_by_the_process(clock, monkeypatch):
    """Each within its own bounds, many slow readers are still cut off once the
    process holds WAITING_MAX responses for them; the one far behind goes, a stream
    that is not behind by UNREAD_MAX is left alone, and the count comes back."""
    monkeypatch.setattr(dataplane, "UNREAD_MAX", 10)
    monkeypatch.setattr(dataplane, "WAITING_MAX", 25)

    async def main():
        core = Core(asyncio.get_running_loop())
        a, b = stream(core), stream(core)
        core.pending[2] = b
        b.rid = 2
        for k in range(16):  # 15 waiting behind a's next
            a._deliver(response(k))
        for k in range(11):  # 10 behind b's: the process holds 25
            b._deliver(response(k))
        assert core.waiting == 25 and not a.closed and not b.closed
        b._deliver(response(11))  # b is past UNREAD_MAX while the process is full
        assert b.closed and not a.closed and core.waiting == 15
        result, final = await b.next()
        assert final and "holds 25 responses" in result.message
        for k in range(16):
            assert (await a.next())[0] == k
        assert core.waiting == 0

    asyncio.run(main())


def test_unread_arena_bytes_are_bounded_too(clock):
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        mib = 1 << 20
        s._deliver(response(0, mib))  # the reader's next: not counted
        for k in range(1, 65):
            s._deliver(response(k, mib))
        assert core.released() == 0 and s.unread_bytes == dataplane.UNREAD_BYTES_MAX
        s._deliver(response(65, 1))
        result, final = await s.next()
        assert isinstance(result, InferError) and final

    asyncio.run(main())


def test_a_reader_that_lags_by_a_few_gets_every_response(clock):
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        got = []
        n = 3 * dataplane.UNREAD_MAX
        for k in range(n):  # 16 MiB each: a bound that counted what was read would trip
            s._deliver(response(k, 16 << 20, final=k == n - 1))
            if k % 2:  # two in, two out: never more than two waiting
                got += [(await s.next())[0], (await s.next())[0]]
        assert got == list(range(n)) and core.released() == 0
        assert s.unread_bytes == 0 and not s.sizes and core.waiting == 0

    asyncio.run(main())


def test_a_lagging_stream_its_client_cancels_leaves_nothing_behind(clock):
    """A client that resets its stream while thousands of responses wait for it: they
    are released, the process's count comes back to 0, and the laggards' look drops
    the stream and stops."""
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        for k in range(dataplane.UNREAD_MAX + 5):
            s._deliver(response(k))
        assert core.waiting == dataplane.UNREAD_MAX + 4 and core.laggards.streams == {s}
        s.cancel()  # what the transport does when its client resets the call
        assert core.waiting == 0 and core.released() == dataplane.UNREAD_MAX + 5
        assert sum(isinstance(m, CancelRequest) for m in core.sent) == 1
        core.laggards.sweep()
        assert not core.laggards.streams and core.laggards.timer is None

    asyncio.run(main())
