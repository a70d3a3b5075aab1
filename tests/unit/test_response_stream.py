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


def test_a_reader_that_reads_nothing_gets_its_request_cancelled_and_one_error():
    async def main():
        core = Core(asyncio.get_running_loop())
        s = stream(core)
        for k in range(dataplane.UNREAD_MAX + 1):
            s._deliver(response(k))
        assert core.released() == 0  # the reader's next and UNREAD_MAX behind it
        s._deliver(response(10**6))  # one more: the request is given up
        assert core.released() == dataplane.UNREAD_MAX + 2
        assert [m for m in core.sent if isinstance(m, CancelRequest)] == [
            CancelRequest(1, "fe")]
        result, final = await s.next()
        assert isinstance(result, InferError) and final
        assert result.code == ErrorCode.UNAVAILABLE
        assert f"last {dataplane.UNREAD_MAX + 1} responses" in result.message
        s._deliver(response(7))  # what the model still sends is released unread
        assert core.released() == dataplane.UNREAD_MAX + 3
        s.cancel()  # the transport's own cancel after that sends nothing more
        assert sum(isinstance(m, CancelRequest) for m in core.sent) == 1

    asyncio.run(main())


def test_unread_arena_bytes_are_bounded_too():
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


def test_a_reader_that_lags_by_a_few_gets_every_response():
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
        assert s.unread_bytes == 0 and not s.sizes

    asyncio.run(main())
