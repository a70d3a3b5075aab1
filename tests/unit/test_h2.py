"""transport/h2.py and transport/grpc_native.py driven frame by frame through a fake
transport: frame parsing, CONTINUATION, both directions of flow control, RST_STREAM
cancelling a handler, GOAWAY draining, trailers and percent-encoding."""

import asyncio
import functools
import struct

import grpc
import hpack
import pytest

from frontend.transport import h2
from frontend.transport.grpc_native import (GrpcConnection, NativeGrpcServer,
                                            parse_timeout, percent_encode)
from frontend.transport.h2_limits import HeldBudget

pytestmark = pytest.mark.timeout(30)


def run(fn):
    """An async test (and its parameters) run on a fresh event loop (no pytest asyncio
    plugin here)."""
    @functools.wraps(fn)
    def test(*args, **kwargs):
        asyncio.run(fn(*args, **kwargs))
    return test


class FakeTransport(asyncio.Transport):
    """What the connection writes lands in `data`. With `stuck` set, the peer reads
    nothing: writes count as unsent and past 64 KiB the protocol's pause_writing is
    called, as a real transport does; drain() lets it all go (resume_writing)."""

    HIGH = 64 << 10

    def __init__(self):
        super().__init__()
        self.data = bytearray()
        self.closed = self.aborted = False
        self.reading = True
        self.vectored = []  # the items of each writelines call
        self.protocol = None
        self.stuck = False
        self.unsent = 0

    def write(self, data):
        self.data += data
        if self.stuck:
            self.unsent += len(data)
            if self.unsent > self.HIGH and not self.protocol.write_paused:
                self.protocol.pause_writing()

    def writelines(self, items):
        self.vectored.append(list(items))
        for item in items:
            self.write(item)

    def get_write_buffer_size(self):
        return self.unsent

    def drain(self):
        self.stuck, self.unsent = False, 0
        if self.protocol.write_paused:
            self.protocol.resume_writing()

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = self.aborted = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5555) if name == "peername" else default


class Peer:
    """A client's end: writes frames into the connection, parses what comes back."""

    def __init__(self, handlers, settings=b"", arena=None, arena_paths=(), limits=None,
                 budget=None, server=None, preface=True):
        server = server or NativeGrpcServer.__new__(NativeGrpcServer)
        server.handlers, server.restrictions = handlers, None
        server.connections = getattr(server, "connections", set())
        server.limits = limits or h2.DEFAULT_LIMITS
        server.budget = budget or HeldBudget()
        server.body_buffer = arena.body_buffer if arena is not None else None
        server.free_blocks = arena.free_blocks if arena is not None else None
        server.arena_paths = frozenset(arena_paths)
        server.arena_body_max = 1 << 20
        self.conn = GrpcConnection(server)
        self.transport = FakeTransport()
        self.transport.protocol = self.conn
        self.conn.connection_made(self.transport)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.frames = []  # (type, flags, stream, payload)
        if preface:
            self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def headers_block(self, path, extra=()):
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", path), (":authority", "x"),
                                    ("content-type", "application/grpc"),
                                    ("te", "trailers"), *extra])

    def request(self, sid, path, message=None, extra=(), end=True):
        data = h2.frame(h2.HEADERS, h2.END_HEADERS, sid, self.headers_block(path, extra))
        if message is not None:
            data += h2.frame(h2.DATA, h2.END_STREAM if end else 0, sid,
                             struct.pack(">BI", 0, len(message)) + message)
        self.send(data)

    async def settle(self):
        for _ in range(5):
            await asyncio.sleep(0)

    def read(self):
        buf = self.transport.data
        pos = 0
        while len(buf) - pos >= 9:
            word, flags, sid = struct.unpack_from(">IBI", buf, pos)
            n = word >> 8
            if len(buf) - pos - 9 < n:
                break
            payload = bytes(buf[pos + 9:pos + 9 + n])
            pos += 9 + n
            kind = word & 0xFF
            if kind == h2.HEADERS:
                payload = dict((k.decode(), v.decode())
                               for k, v in self.decoder.decode(payload, raw=True))
            self.frames.append((kind, flags, sid, payload))
        del buf[:pos]
        return self.frames

    def of(self, sid, kind=None):
        return [f for f in self.read() if f[2] == sid and (kind is None or f[0] == kind)]

    def body(self, sid):
        return b"".join(f[3] for f in self.of(sid, h2.DATA))


def _echo_handlers(started=None):
    async def echo(request, context):
        return request

    async def big(request, context):
        return b"x" * int(request)

    async def slow(request, context):
        if not started.done():
            started.set_result(context)
        await asyncio.sleep(3600)

    async def fail(request, context):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad 100% \u00e9\nline")

    async def chat(requests, context):
        async for r in requests:
            await context.write(r.upper())

    u = grpc.unary_unary_rpc_method_handler
    return {"/s/Echo": u(echo), "/s/Big": u(big), "/s/Slow": u(slow), "/s/Fail": u(fail),
            "/s/Chat": grpc.stream_stream_rpc_method_handler(chat)}


def test_percent_encoding_and_timeout():
    assert percent_encode("plain text") == b"plain text"
    assert percent_encode("100% \u00e9\n") == b"100%25 %C3%A9%0A"
    assert parse_timeout(b"1S") == 1.0 and parse_timeout(b"250m") == 0.25
    assert parse_timeout(b"x") is None and parse_timeout(b"123456789S") is None
    assert h2.hpack_int(10, 5) == b"\x0a" and h2.hpack_int(1337, 5) == b"\x1f\x9a\x0a"


@run
async def test_settings_ping_and_unary_reply_in_one_write():
    p = Peer(_echo_handlers())
    frames = p.read()
    assert frames[0][0] == h2.SETTINGS and not frames[0][1] & h2.ACK
    assert any(f[0] == h2.SETTINGS and f[1] & h2.ACK for f in frames)
    p.send(h2.frame(h2.PING, 0, 0, b"12345678"))
    assert (h2.PING, h2.ACK, 0, b"12345678") in p.read()
    p.request(1, "/s/Echo", b"hello")
    await p.settle()
    heads = p.of(1, h2.HEADERS)
    assert heads[0][3][":status"] == "200"
    assert heads[0][3]["content-type"] == "application/grpc"
    assert heads[-1][1] & h2.END_STREAM and heads[-1][3]["grpc-status"] == "0"
    assert p.body(1) == b"\x00\x00\x00\x00\x05hello"


@run
async def test_continuation_and_padding():
    p = Peer(_echo_handlers())
    block = p.headers_block("/s/Echo", [("x-long", "v" * 3000)])
    cut = len(block) // 3
    padded = bytes((4,)) + struct.pack(">BI", 0, 2) + b"hi" + b"\0" * 4
    p.send(h2.frame(h2.HEADERS, 0, 1, block[:cut])
           + h2.frame(h2.CONTINUATION, 0, 1, block[cut:2 * cut])
           + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[2 * cut:])
           + h2.frame(h2.DATA, h2.PADDED | h2.END_STREAM, 1, padded))
    await p.settle()
    assert p.body(1) == b"\x00\x00\x00\x00\x02hi"


@run
async def test_a_continuation_flood_closes_the_connection():
    # header blocks that never end would grow without bound: GOAWAY past 1 MiB
    p = Peer(_echo_handlers())
    p.send(h2.frame(h2.HEADERS, 0, 1, p.headers_block("/s/Echo", [])[:5]))
    chunk = b"\x00" * 65536
    for _ in range(h2.MAX_HEADER_BLOCK // len(chunk) + 1):
        if p.transport.closed:
            break
        p.send(h2.frame(h2.CONTINUATION, 0, 1, chunk))
    await p.settle()
    assert p.transport.closed
    goaway = [f for f in p.read() if f[0] == h2.GOAWAY]
    assert goaway and struct.unpack(">I", goaway[-1][3][4:8])[0] == h2.ENHANCE_YOUR_CALM


@run
async def test_a_unary_reply_the_windows_take_goes_out_whole_else_in_steps():
    """A reply that fits the windows and a frame is queued as one piece (send_whole):
    HEADERS, DATA, then trailers ending the stream, the windows charged, the stream
    forgotten; one the stream's window cannot take goes the long way, its trailers
    held back behind the data until the window opens."""
    p = Peer(_echo_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 8))
    conn = p.conn
    queued = []
    whole = conn.send_whole
    conn.send_whole = lambda *a: queued.append(whole(*a)) or queued[-1]
    p.request(1, "/s/Echo", b"hi")  # 7 bytes with its prefix: fits
    await p.settle()
    kinds = [(f[0], f[1] & h2.END_STREAM) for f in p.of(1)]
    assert kinds == [(h2.HEADERS, 0), (h2.DATA, 0), (h2.HEADERS, h2.END_STREAM)]
    assert p.of(1, h2.HEADERS)[0][3][":status"] == "200"
    assert p.of(1, h2.HEADERS)[-1][3]["grpc-status"] == "0"
    assert p.body(1) == b"\x00\x00\x00\x00\x02hi"
    assert queued == [True] and 1 not in conn.streams
    assert conn.send_window == h2.DEFAULT_WINDOW - 7
    p.request(3, "/s/Echo", b"hello")  # 10 bytes: the stream's window takes 8
    await p.settle()
    assert queued == [True, False]
    assert p.body(3) == b"\x00\x00\x00\x00\x05hel"
    assert [f[1] & h2.END_STREAM for f in p.of(3, h2.HEADERS)] == [0]
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 3, struct.pack(">I", 2)))
    await p.settle()
    assert p.body(3) == b"\x00\x00\x00\x00\x05hello"
    assert p.of(3, h2.HEADERS)[-1][1] & h2.END_STREAM and 3 not in conn.streams
    assert conn.send_window == h2.DEFAULT_WINDOW - 17


@run
async def test_send_flow_control_tiny_window():
    # the peer grants 100 bytes per stream and 16 KiB frames: the reply comes in pieces
    p = Peer(_echo_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 100))
    p.request(1, "/s/Big", b"50000")
    await p.settle()
    assert len(p.body(1)) == 100 and not p.of(1, h2.HEADERS)[-1][1] & h2.END_STREAM
    got = 100
    while got < 50005:
        p.send(h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 20000)))
        await p.settle()
        now = len(p.body(1))
        assert now - got <= 20000
        got = now
        if got < 65535:  # the connection window (65535) binds too
            pass
        else:
            p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    assert all(len(f[3]) <= 16384 for f in p.of(1, h2.DATA))
    assert p.body(1) == struct.pack(">BI", 0, 50000) + b"x" * 50000
    assert p.of(1, h2.HEADERS)[-1][3]["grpc-status"] == "0"


@run
async def test_settings_ack_goes_before_the_data_a_larger_window_lets_out():
    """A peer that raises its initial window counts on the new size only once it has
    our ACK (grpc-core resets the stream otherwise: "frame of size 5 overflows local
    window of 0"): the data held back by the old window follows the ACK."""
    p = Peer(_echo_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 100))
    p.request(1, "/s/Big", b"5000")
    await p.settle()
    assert len(p.body(1)) == 100  # the rest waits for window
    p.frames.clear()
    p.send(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 1 << 20)))
    await p.settle()
    kinds = [(f[0], f[1] & h2.ACK if f[0] == h2.SETTINGS else 0) for f in p.read()]
    ack = kinds.index((h2.SETTINGS, h2.ACK))
    first_data = next(i for i, f in enumerate(p.frames) if f[0] == h2.DATA)
    assert ack < first_data
    assert len(p.body(1)) == 5005 - 100


@run
async def test_receive_window_given_back():
    p = Peer(_echo_handlers())
    p.read()
    chunk = b"y" * (1 << 20)
    message = struct.pack(">BI", 0, 40 << 20)
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.headers_block("/s/Echo")))
    p.send(h2.frame(h2.DATA, 0, 1, message))
    for _ in range(40):
        p.send(h2.frame(h2.DATA, 0, 1, chunk))
    p.send(h2.frame(h2.DATA, h2.END_STREAM, 1, b""))
    updates = [f for f in p.read() if f[0] == h2.WINDOW_UPDATE]
    conn = sum(struct.unpack(">I", f[3])[0] for f in updates if f[2] == 0)
    stream = sum(struct.unpack(">I", f[3])[0] for f in updates if f[2] == 1)
    assert conn >= (40 << 20) - h2.RECV_CONN_WINDOW  # batches, not one per frame
    assert stream >= (40 << 20) - h2.RECV_STREAM_WINDOW
    assert len(updates) < 20
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))
    p.send(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.INITIAL_WINDOW_SIZE,
                                                     1 << 30)))
    await p.settle()
    assert len(p.body(1)) == (40 << 20) + 5


@run
async def test_rst_stream_cancels_the_handler():
    started = asyncio.get_running_loop().create_future()
    p = Peer(_echo_handlers(started))
    p.request(1, "/s/Slow", b"")
    context = await asyncio.wait_for(started, 5)
    call = p.conn.streams[1].app
    p.send(h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">I", h2.CANCEL)))
    await p.settle()
    assert call.task.done() and context.cancelled()
    assert not p.of(1, h2.HEADERS) and 1 not in p.conn.streams


@run
async def test_goaway_drains_running_streams():
    started = asyncio.get_running_loop().create_future()
    handlers = _echo_handlers(started)
    release = asyncio.Event()

    async def slow(request, context):
        started.set_result(None)
        await release.wait()
        return b"done"

    handlers["/s/Slow"] = grpc.unary_unary_rpc_method_handler(slow)
    p = Peer(handlers)
    p.request(1, "/s/Slow", b"")
    await started
    p.conn.goaway()
    assert any(f[0] == h2.GOAWAY for f in p.read()) and not p.transport.closed
    p.request(3, "/s/Echo", b"late")  # after GOAWAY: refused
    await p.settle()
    assert p.of(3, h2.RST_STREAM)
    release.set()
    await p.settle()
    assert p.body(1).endswith(b"done") and p.transport.closed


@run
async def test_errors_trailers_only_and_percent_encoded():
    p = Peer(_echo_handlers())
    p.request(1, "/s/Fail", b"")
    p.request(3, "/s/Nope", b"")
    await p.settle()
    (head,) = p.of(1, h2.HEADERS)  # trailers-only
    assert head[1] & h2.END_STREAM and head[3]["grpc-status"] == "3"
    assert head[3]["grpc-message"] == "bad 100%25 %C3%A9%0Aline"
    assert p.of(3, h2.HEADERS)[0][3]["grpc-status"] == "12"


@run
async def test_streaming_and_deadline():
    p = Peer(_echo_handlers(asyncio.get_running_loop().create_future()))
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.headers_block("/s/Chat")))
    for word in (b"ab", b"cd"):
        p.send(h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 0, 2) + word))
        await p.settle()
    p.send(h2.frame(h2.DATA, h2.END_STREAM, 1, b""))
    await p.settle()
    assert p.body(1) == b"\0\0\0\0\x02AB\0\0\0\0\x02CD"
    assert p.of(1, h2.HEADERS)[-1][3]["grpc-status"] == "0"
    p.request(3, "/s/Slow", b"", extra=[("grpc-timeout", "20m")])
    for _ in range(500):  # the 20 ms deadline, polled for up to 5 s
        if p.of(3, h2.HEADERS):
            break
        await asyncio.sleep(0.01)
    assert p.of(3, h2.HEADERS)[-1][3]["grpc-status"] == "4"
    # the same header block again (HPACK's indexed form, the decoder's cached tuple):
    # each call still gets a deadline of its own, from when it came
    blocks = []
    block = p.headers_block
    p.headers_block = lambda *a: blocks.append(block(*a)) or blocks[-1]
    for sid in (5, 7):
        p.request(sid, "/s/Slow", b"", extra=[("grpc-timeout", "20m")])
        for _ in range(500):
            if p.of(sid, h2.HEADERS):
                break
            await asyncio.sleep(0.01)
        assert p.of(sid, h2.HEADERS)[-1][3]["grpc-status"] == "4"
    assert blocks[0] == blocks[1]


class FakeArena:
    """The core's body_buffer / free_blocks: hands out buffers, records frees."""

    def __init__(self):
        self.given = {}  # block -> its buffer
        self.freed = []

    def body_buffer(self, nbytes, quota=None):
        block = ("seg", len(self.given))
        self.given[block] = buf = bytearray(nbytes)
        return memoryview(buf), block

    def free_blocks(self, blocks):
        self.freed.extend(blocks)


def _arena_handlers(seen):
    async def take(request, context):
        seen.append((request, context.take_body_block()))
        return b"%d" % len(request)

    async def keep(request, context):  # decodes, fails, never takes the block
        seen.append((request, None))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")

    u = grpc.unary_unary_rpc_method_handler
    return {"/s/Take": u(take), "/s/Keep": u(keep), "/s/Other": u(take)}


ARENA_PATHS = ("/s/Take", "/s/Keep")


def _send_in_pieces(p, sid, path, message, piece=100_000, end=True, extra=b""):
    p.request(sid, path)
    data = struct.pack(">BI", 0, len(message)) + message + extra
    for i in range(0, len(data), piece):
        last = end and i + piece >= len(data)
        p.send(h2.frame(h2.DATA, h2.END_STREAM if last else 0, sid, data[i:i + piece]))


@run
async def test_a_large_unary_message_is_received_into_an_arena_block_the_handler_takes():
    arena, seen = FakeArena(), []
    p = Peer(_arena_handlers(seen), arena=arena, arena_paths=ARENA_PATHS)
    message = bytes(range(256)) * 1200  # 300 KiB: over BODY_IN_ARENA_MIN
    _send_in_pieces(p, 1, "/s/Take", message)
    await p.settle()
    (request, block), = seen
    assert list(arena.given) == [block] and arena.freed == []  # the handler's to free
    assert bytes(request) == message and request.obj is arena.given[block]
    assert p.body(1)[5:] == b"%d" % len(message)
    assert p.of(1, h2.HEADERS)[-1][3]["grpc-status"] == "0"


@run
async def test_an_arena_block_nobody_takes_is_freed_however_the_call_ends():
    arena, seen = FakeArena(), []
    p = Peer(_arena_handlers(seen), arena=arena, arena_paths=ARENA_PATHS)
    message = b"m" * 300_000
    _send_in_pieces(p, 1, "/s/Keep", message)  # the handler fails without taking it
    p.request(3, "/s/Take")  # 200 of 300 kB, then the end of the stream: incomplete
    p.send(h2.frame(h2.DATA, 0, 3, struct.pack(">BI", 0, len(message)) + message[:200_000]))
    p.send(h2.frame(h2.DATA, h2.END_STREAM, 3, b""))
    _send_in_pieces(p, 5, "/s/Take", message, extra=b"\0" * 10)  # a second message
    p.request(7, "/s/Take")  # 200 of 300 kB, then cancelled
    p.send(h2.frame(h2.DATA, 0, 7, struct.pack(">BI", 0, len(message)) + message[:200_000]))
    p.send(h2.frame(h2.RST_STREAM, 0, 7, struct.pack(">I", h2.CANCEL)))
    await p.settle()
    assert len(arena.given) == 4 and sorted(arena.freed) == sorted(arena.given)
    status = {sid: p.of(sid, h2.HEADERS)[-1][3] for sid in (1, 3, 5)}
    assert status[1]["grpc-status"] == "3"
    assert status[3]["grpc-status"] == "13" and "Incomplete" in status[3]["grpc-message"]
    assert status[5]["grpc-status"] == "13" and "more than one" in status[5]["grpc-message"]
    assert [len(r) for r, _ in seen] == [len(message)]  # only the whole message ran


@run
async def test_small_messages_and_other_methods_stay_in_process_memory():
    arena, seen = FakeArena(), []
    p = Peer(_arena_handlers(seen), arena=arena, arena_paths=ARENA_PATHS)
    _send_in_pieces(p, 1, "/s/Take", b"s" * 1000)
    _send_in_pieces(p, 3, "/s/Other", b"o" * 300_000)
    _send_in_pieces(p, 5, "/s/Take", b"L" * ((1 << 20) + 1))  # over arena_body_max
    await p.settle()
    assert arena.given == {} and [(len(r), b) for r, b in seen] == [
        (1000, None), (300_000, None), ((1 << 20) + 1, None)]


@run
async def test_a_large_reply_goes_out_as_views_of_the_message_not_a_joined_copy():
    """Many frames of one large message are written with writelines, each DATA payload
    a view of the serialized message; small replies stay one joined write."""
    p = Peer(_echo_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 1 << 20))
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    p.request(1, "/s/Echo", b"small")
    await p.settle()
    assert p.transport.vectored == [] and p.body(1) == struct.pack(">BI", 0, 5) + b"small"
    p.request(3, "/s/Big", b"200000")
    await p.settle()
    (items,), = [p.transport.vectored]
    assert sum(map(len, items)) >= h2.WRITELINES_MIN
    assert any(isinstance(i, memoryview) and len(i) == 16384 for i in items)
    assert p.body(3) == struct.pack(">BI", 0, 200000) + b"x" * 200000
    assert p.of(3, h2.HEADERS)[-1][3]["grpc-status"] == "0"


@run
async def test_a_view_of_the_read_buffer_kept_past_its_call_breaks_nothing():
    # a hook's view of a DATA frame (e.g. held by a logged traceback's frames) must
    # not make the next read fail on resizing the buffer it points into
    p = Peer(_echo_handlers())
    kept = []
    original = p.conn.stream_data

    def keep(stream, data):
        kept.append(data)  # outlives the call
        original(stream, data)

    p.conn.stream_data = keep
    p.request(1, "/s/Echo", b"first")
    await p.settle()
    p.request(3, "/s/Echo", b"second")
    await p.settle()
    assert p.body(1) == b"\x00\x00\x00\x00\x05first"
    assert p.body(3) == b"\x00\x00\x00\x00\x06second"
    assert not p.transport.closed


# -- a streaming call's queued messages hold their windows until its handler reads them


def _gated_handlers(permits, got):
    """/s/Gated takes one request message per permit (an asyncio.Queue), no sooner."""
    async def gated(requests, context):
        messages = requests.__aiter__()
        while True:
            await permits.get()
            try:
                got.append(len(await messages.__anext__()))
            except StopAsyncIteration:
                return

    return {"/s/Gated": grpc.stream_stream_rpc_method_handler(gated)}


MIB_MESSAGE = struct.pack(">BI", 0, (1 << 20) - 5) + b"m" * ((1 << 20) - 5)  # 1 MiB


def _window_updates(p, sid):
    """The window given back on `sid` (0: the connection) since the last look."""
    frames = p.read()
    given = sum(struct.unpack(">I", f[3])[0] for f in frames
                if f[0] == h2.WINDOW_UPDATE and f[2] == sid)
    p.frames = [f for f in frames if not (f[0] == h2.WINDOW_UPDATE and f[2] == sid)]
    return given


async def _let(permits, p, n):
    for _ in range(n):
        permits.put_nowait(None)
    await p.settle()


@run
async def test_messages_a_streaming_handler_has_not_read_keep_the_stream_window_shut():
    permits, got = asyncio.Queue(), []
    p = Peer(_gated_handlers(permits, got))
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.headers_block("/s/Gated")))
    for _ in range(16):  # the whole stream window, 16 MiB, in whole messages
        p.send(h2.frame(h2.DATA, 0, 1, MIB_MESSAGE))
    await p.settle()
    assert got == [] and _window_updates(p, 1) == 0
    assert p.conn.recv_held == 16 << 20
    await _let(permits, p, 7)
    assert len(got) == 7 and _window_updates(p, 1) == 0  # 7 MiB: not yet a frame's worth
    await _let(permits, p, 1)
    assert _window_updates(p, 1) == 8 << 20  # half the window read: given back
    # past what was granted, the stream is reset (the handler's loop ends)
    for _ in range(9):
        p.send(h2.frame(h2.DATA, 0, 1, MIB_MESSAGE))
    await p.settle()
    assert [f[3] for f in p.of(1, h2.RST_STREAM)] == [struct.pack(">I",
                                                                  h2.FLOW_CONTROL_ERROR)]
    assert p.conn.recv_held == 0  # what was still queued gave its window back


@run
async def test_streams_that_are_not_read_hold_no_more_than_the_connection_window():
    permits, got = asyncio.Queue(), []
    p = Peer(_gated_handlers(permits, got))
    _window_updates(p, 0)  # the connection window's first update, to 64 MiB
    for sid in (1, 3, 5, 7):  # 4 x 16 MiB: the connection's 64 MiB window
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, p.headers_block("/s/Gated")))
        for _ in range(16):
            p.send(h2.frame(h2.DATA, 0, sid, MIB_MESSAGE))
    await p.settle()
    assert _window_updates(p, 0) == 0 and p.conn.recv_held == 64 << 20
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 9, p.headers_block("/s/Gated")))
    p.send(h2.frame(h2.DATA, 0, 9, MIB_MESSAGE))  # past the connection window
    assert p.of(0, h2.GOAWAY)[0][3][4:8] == struct.pack(">I", h2.FLOW_CONTROL_ERROR)


@run
async def test_a_streaming_call_gives_back_the_window_of_what_it_never_read():
    permits, got = asyncio.Queue(), []
    p = Peer(_gated_handlers(permits, got))
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.headers_block("/s/Gated")))
    for _ in range(12):
        p.send(h2.frame(h2.DATA, 0, 1, MIB_MESSAGE))
    p.send(h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">I", h2.CANCEL)))
    await p.settle()
    assert p.conn.recv_held == 0 and got == []
    # the connection's window is whole again: 64 MiB more on new streams, all read
    for sid in (3, 5, 7, 9):
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, p.headers_block("/s/Gated")))
        for _ in range(13):
            p.send(h2.frame(h2.DATA, 0, sid, MIB_MESSAGE))
        await _let(permits, p, 13)
    assert len(got) == 52 and not p.of(0, h2.GOAWAY)


@run
async def test_a_streamed_message_larger_than_the_stream_window_still_arrives():
    permits, got = asyncio.Queue(), []
    p = Peer(_gated_handlers(permits, got))
    permits.put_nowait(None)
    size = 24 << 20  # half as large again as the stream window
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.headers_block("/s/Gated")))
    p.send(h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 0, size)))
    sent = given = 0
    while sent < size:
        # as a client does: no more than the window the server has granted
        given += _window_updates(p, 1)
        granted = h2.RECV_STREAM_WINDOW - 5 - sent + given
        chunk = min(1 << 20, size - sent, granted)
        assert chunk > 0, "the stream window stayed shut on a message being received"
        p.send(h2.frame(h2.DATA, 0, 1, b"z" * chunk))
        sent += chunk
    await p.settle()
    assert got == [size]
