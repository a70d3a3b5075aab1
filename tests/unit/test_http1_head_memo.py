"""frontend/transport/http1.py's head memo (_Head): a read that repeats the head of the
connection's last request, with exactly the body it announces, is served without the
parser; every other read goes to the parser as before. One in-memory connection per
test, each data_received() a socket read, and the parser's reads counted."""

import asyncio

import numpy as np
import pytest
from starlette.routing import Route
from tritonclient.grpc import model_config_pb2

from frontend.http_server import BODY_IN_ARENA_MIN, make_http_app
from frontend.transport import http1
from frontend.types import ModelView
from tests.unit.test_http1 import ArenaCore, Echo, check_identity, infer_request
from tests.unit.test_http_server import IDENTITY, _Wire, infer_body

pytestmark = pytest.mark.timeout(30)


class CountingParser:
    """The connection's httptools parser, counting the reads it is given."""

    def __init__(self, inner):
        self.inner = inner
        self.fed = 0

    def feed_data(self, data):
        self.fed += 1
        self.inner.feed_data(data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Wire(_Wire):
    """The server's end of the connection: every response it writes, parsed."""

    def __init__(self):
        super().__init__()
        self.done: list = []

    def on_message_begin(self):
        self.headers, self.body = {}, bytearray()

    def on_message_complete(self):
        self.done.append((self.parser.get_status_code(), self.headers, bytes(self.body)))


class Conn:
    """One connection to an app with the identity model and POST /echo."""

    def __init__(self, core=None):
        self.core = core or ArenaCore()
        app = make_http_app(self.core, routes=[Route("/echo", Echo(), methods=["POST"])],
                            max_input_size=4 << 20)
        self.wire = Wire()
        self.proto = http1.HttpProtocol(app, set())
        self.proto.connection_made(self.wire)
        self.parser = self.proto.parser = CountingParser(self.proto.parser)

    async def answers(self, n):
        """The first n responses, waited for with a deadline."""
        for _ in range(1000):
            if len(self.wire.done) >= n:
                return self.wire.done[:n]
            await asyncio.sleep(0.005)
        raise AssertionError(f"{len(self.wire.done)} of {n} responses came")

    async def one_by_one(self, reads):
        """Each read in turn, its answer waited for before the next, as wrk and
        tritonclient send."""
        for read in reads:
            n = len(self.wire.done) + 1  # counted first: an error is answered at once
            self.proto.data_received(read)
            await self.answers(n)

    async def identities(self, datas):
        """The answers so far are the identity model's, of `datas` in order."""
        for answer, data in zip(await self.answers(len(datas)), datas):
            check_identity(*answer, data)


def request_of(data: np.ndarray) -> bytes:
    """An infer request for [1,16] FP32 `data`, in tritonclient's binary form: its head
    is the same for any data of that shape."""
    inp_data, body, headers = infer_body()
    raw = data.astype(np.float32).tobytes()
    assert body.endswith(inp_data.tobytes())
    return infer_request(body[:-len(raw)] + raw, headers)


def on_conn(test, core=None):
    """`await test(conn)` on a new connection, which is then lost, with a deadline."""
    async def go():
        c = Conn(core)
        try:
            await test(c)
        finally:
            c.proto.connection_lost(None)
    asyncio.run(asyncio.wait_for(go(), 20))


def test_a_repeated_head_is_parsed_once_and_each_request_gets_its_own_body():
    async def test(c):
        datas = [np.full((1, 16), i, np.float32) for i in range(6)]
        await c.one_by_one([request_of(data) for data in datas])
        await c.identities(datas)
        assert c.parser.fed == 1, "the parser read the repeated heads again"
        assert c.core.released == 6
    on_conn(test)


def test_repeats_read_while_one_is_answered_wait_in_the_pipeline_in_order():
    async def test(c):
        datas = [np.full((1, 16), i, np.float32) for i in range(5)]
        c.proto.data_received(request_of(datas[0]))
        await c.answers(1)
        for data in datas[1:]:  # no answer waited for: they queue behind the first
            c.proto.data_received(request_of(data))
        assert len(c.proto.pipeline) == 4
        await c.identities(datas)
        assert c.parser.fed == 1 and not c.proto.pipeline
    on_conn(test)


def test_another_head_is_parsed_and_becomes_the_one_remembered():
    async def test(c):
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        other = request_of(data).replace(b"/v2/models/identity/infer",
                                         b"/v2/models/identity/versions/1/infer")
        await c.one_by_one([request_of(data), other, other, request_of(data)])
        await c.identities([data] * 4)
        # the first, the other (new), the other again (remembered), the first (new)
        assert c.parser.fed == 3
    on_conn(test)


def test_a_read_with_more_or_less_than_one_request_goes_to_the_parser():
    async def test(c):
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        wire = request_of(data)
        c.proto.data_received(wire + wire)  # two at once: nothing remembered
        await c.answers(2)
        c.proto.data_received(wire)
        await c.answers(3)
        assert c.parser.fed == 2
        c.proto.data_received(wire[:-5])  # remembered now; this read is short of it
        c.proto.data_received(wire[-5:])
        c.proto.data_received(wire + wire[:10])  # and this one longer
        c.proto.data_received(wire[10:])
        await c.identities([data] * 6)
        assert c.parser.fed == 6
    on_conn(test)


def test_the_remembered_bytes_inside_another_requests_body_are_its_body():
    """A read that equals the remembered request but comes while another request's
    body is still arriving is that body's, byte for byte."""
    async def test(c):
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        wire = request_of(data)
        c.proto.data_received(wire)
        await c.answers(1)
        body = wire + b"tail"
        c.proto.data_received(b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n\r\n"
                              % len(body))
        c.proto.data_received(wire)
        c.proto.data_received(b"tail")
        (status, _, echoed), = (await c.answers(2))[1:]
        assert status == 200 and echoed == body
        c.proto.data_received(wire)  # and the memo still serves the next at a boundary
        check_identity(*(await c.answers(3))[2], data)
        assert c.parser.fed == 4
    on_conn(test)


def test_heads_that_change_the_connection_are_not_remembered():
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    _, body, headers = infer_body()

    async def closing(c):
        c.proto.data_received(infer_request(body, headers, extra=b"connection: close\r\n"))
        check_identity(*(await c.answers(1))[0], data)
        assert c.proto.head_memo is None and c.wire.closed

    async def expecting(c):
        # the parser's path answers a 100-continue before the body it has in hand;
        # a repeat would not, so these are parsed every time
        wire = infer_request(body, headers, extra=b"expect: 100-continue\r\n")
        for i in range(2):
            c.proto.data_received(wire)
            go_on, answer = (await c.answers(2 * i + 2))[2 * i:]
            assert go_on[0] == 100
            check_identity(*answer, data)
        assert c.proto.head_memo is None and c.parser.fed == 2

    on_conn(closing)
    on_conn(expecting)


def test_http10_and_refused_requests_are_not_remembered():
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    wire = request_of(data).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    kept = wire.replace(b"\r\n\r\n", b"\r\nconnection: keep-alive\r\n\r\n", 1)

    async def http10(c):
        c.proto.data_received(wire)
        check_identity(*(await c.answers(1))[0], data)
        assert c.proto.head_memo is None and c.wire.closed  # 1.0: one request

    async def http10_kept_alive(c):  # remembered, and stays alive
        await c.one_by_one([kept] * 3)
        await c.identities([data] * 3)
        assert c.parser.fed == 1 and not c.wire.closed

    async def refused(c):
        big = b"x" * ((4 << 20) + 1)
        c.proto.data_received(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                              b"content-length: %d\r\n\r\n" % len(big) + big)
        status, _, _ = (await c.answers(1))[0]
        assert status == 400 and c.proto.head_memo is None

    for test in (http10, http10_kept_alive, refused):
        on_conn(test)


def _arena_sized(core):
    """(data, body, headers) of a request whose body the arena takes straight, `core`'s
    identity model made to batch that many rows."""
    n = BODY_IN_ARENA_MIN // 64 + 1
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(IDENTITY)
    config.max_batch_size = n
    core.models["identity"] = [ModelView("identity", 1, "READY", "", config)]
    return infer_body(batch=n)


def test_a_large_body_of_a_remembered_head_lands_in_the_arena():
    """The body of a repeated head goes where the parser would have put it: straight
    into a block of the arena once it is large, a new block each time."""
    core = ArenaCore()
    data, body, headers = _arena_sized(core)

    async def test(c):
        await c.one_by_one([infer_request(body, headers)] * 3)
        await c.identities([data] * 3)
        assert c.parser.fed == 1
        assert core.blocks == [len(body)] * 3
    on_conn(test, core)


def test_a_long_head_is_not_remembered():
    """What a connection remembers stays small whatever a client sends: a head past
    MEMO_HEAD_MAX is parsed every time."""
    async def test(c):
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        _, body, headers = infer_body()
        filler = b"x-filler: " + b"f" * http1.MEMO_HEAD_MAX + b"\r\n"
        wire = infer_request(body, headers, extra=filler)
        for i in range(2):
            c.proto.data_received(wire)
            check_identity(*(await c.answers(i + 1))[i], data)
        assert c.proto.head_memo is None and c.parser.fed == 2
    on_conn(test)



class StalledCore(ArenaCore):
    """A core whose answers never come: requests pile up behind the first."""

    async def infer(self, request, decoupled_refusal=""):
        await asyncio.Event().wait()


def test_a_peer_that_sends_repeats_and_gets_no_answers_stops_being_read_at_the_cap():
    """What a hostile peer can pile up through the memo's path is bounded as on the
    parser's: once MAX_PIPELINE requests wait behind the one being answered, the
    connection stops reading."""
    async def test(c):
        wire = request_of(np.zeros((1, 16), np.float32))
        sent = 0
        while not c.proto.read_paused and sent < 4 * http1.MAX_PIPELINE:
            c.proto.data_received(wire)
            sent += 1
        assert c.proto.read_paused and sent == http1.MAX_PIPELINE + 1
        assert c.parser.fed == 1  # all but the first came through the memo
    on_conn(test, StalledCore())


def test_a_peer_that_leaves_frees_the_bodies_its_repeats_hold():
    """Large bodies taken through the memo wait in the arena; when the peer resets,
    those of requests that never started go back at once (the started one is the
    core's, cancelled with it)."""
    core = StalledCore()
    _, body, headers = _arena_sized(core)

    async def test(c):
        for _ in range(3):
            c.proto.data_received(infer_request(body, headers))
        assert c.parser.fed == 1 and core.blocks == [len(body)] * 3
        await asyncio.sleep(0)  # the first starts in the core
        c.proto.connection_lost(ConnectionResetError())
        assert sorted(core.freed) == [1, 2]
        assert not c.proto.pipeline
    on_conn(test, core)
