"""Property-based tests (Hypothesis) of the native HTTP/2 transport (transport/h2.py),
in process through tests/unit/test_h2.py's Peer:

- the frame parser: any byte stream (frames of any type, flags, stream and payload
  after a valid preface, or anything at all), handed over in any chunking by a
  transport that honours pause_reading, never escapes the connection's own handling:
  the connection is served on or ends with a GOAWAY whose code is a protocol error,
  never INTERNAL_ERROR; it settles in a bounded number of loop turns, and what it
  buffers stays within one frame and one chunk;
- flow control: under any sequence of requests with large and streamed replies,
  WINDOW_UPDATEs, SETTINGS changing the initial window and resets, no DATA frame ever
  exceeds the window the peer granted (per stream and for the connection) or its
  MAX_FRAME_SIZE, nothing is sent on a stream after its end, and the bytes counted as
  held are exactly those waiting in the streams, for the connection and its budget.

(The header decoder's cache has its own properties in test_hpack_cache.py.)
"""

from __future__ import annotations

import asyncio
import struct

import grpc
import hpack
from hypothesis import given, note, settings
from hypothesis import strategies as st

from frontend.transport import h2
from frontend.transport.h2_limits import HeldBudget, Limits
from tests.unit.test_h2 import Peer, _echo_handlers

ERRORS = {h2.PROTOCOL_ERROR, h2.FLOW_CONTROL_ERROR, h2.STREAM_CLOSED,
          h2.FRAME_SIZE_ERROR, h2.COMPRESSION_ERROR, h2.ENHANCE_YOUR_CALM,
          h2.SETTINGS_TIMEOUT}
SMALL = Limits(frames_per_read=8, streams_per_read=2, glitch_burst=50,
               reset_burst=20, max_header_block=2048, max_header_list=1024)


def _handlers():
    handlers = _echo_handlers()

    async def chunks(request, context):
        for _ in range(int(request)):
            await context.write(b"z" * 3000)

    handlers["/s/Chunks"] = grpc.unary_stream_rpc_method_handler(chunks)
    return handlers


def _block(path: str) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                   (":path", path), ("te", "trailers")])


FRAME = st.tuples(
    st.sampled_from(list(range(10)) + [0x20]),  # every type, and an unknown one
    st.sampled_from([0, h2.END_STREAM, h2.END_HEADERS, h2.END_HEADERS | h2.END_STREAM,
                     h2.PADDED, h2.PRIORITY, h2.ACK, 0xFF]),
    st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.one_of(st.binary(max_size=9), st.binary(max_size=40),  # sizes near the edges
              st.sampled_from([_block("/s/Echo"), _block("/s/Chunks"), b"\x00\x00\x00\x00",
                               struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0),
                               b"\x00\x00\x00\x00\x02hi", b"12345678"])))


def _frames(frames) -> bytes:
    return b"".join(h2.frame(k, f, s, p) for k, f, s, p in frames)


STREAM = st.one_of(
    st.lists(FRAME, max_size=25).map(
        lambda fs: h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + _frames(fs)),
    st.binary(max_size=300),
    st.lists(FRAME, max_size=10).map(lambda fs: h2.PREFACE + _frames(fs)))


@settings(max_examples=2 * settings.default.max_examples)
@given(STREAM, st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_any_byte_stream_in_any_chunking_gets_a_protocol_answer(data, cuts):
    note(f"{len(data)} bytes: {data[:120]!r}")
    errors = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, ctx: errors.append(ctx))
        p = Peer(_handlers(), preface=False, limits=SMALL)
        pos, i = 0, 0
        turns = 0
        while pos < len(data) or not p.transport.reading:
            if p.transport.reading and pos < len(data):  # a transport honours pauses
                chunk = data[pos:pos + cuts[i % len(cuts)]]
                pos, i = pos + len(chunk), i + 1
                p.send(chunk)
                assert len(p.conn.buf) <= h2.RECV_MAX_FRAME + 9 + len(chunk)
            await asyncio.sleep(0)
            turns += 1
            assert turns < 10 * len(data) + 100, "the connection does not settle"
            if p.transport.closed:
                break
        for _ in range(20):
            await asyncio.sleep(0)
        goaways = [struct.unpack(">I", f[3][4:8])[0] for f in p.read() if f[0] == h2.GOAWAY]
        if p.transport.closed and p.conn.settled:
            assert goaways and goaways[-1] in ERRORS, goaways
        assert h2.INTERNAL_ERROR not in goaways
        p.conn.connection_lost(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert p.conn.held == 0 and p.conn.budget.held == 0

    asyncio.run(main())
    assert not errors, errors[0]


OP = st.one_of(
    st.tuples(st.just("big"), st.integers(0, 70_000)),
    st.tuples(st.just("chunks"), st.integers(0, 30)),
    st.tuples(st.just("conn_update"), st.integers(1, 100_000)),
    st.tuples(st.just("stream_update"), st.integers(0, 8), st.integers(1, 100_000)),
    st.tuples(st.just("initial"), st.integers(0, 70_000)),
    st.tuples(st.just("frame"), st.sampled_from([16384, 20000, 65536])),
    st.tuples(st.just("reset"), st.integers(0, 8)),
)


class Window:
    """The client's view of the windows it granted, RFC 9113 6.9."""

    def __init__(self, initial: int):
        self.conn = 65535
        self.initial = initial
        self.streams: dict[int, int] = {}
        self.ended: set[int] = set()
        self.max_frame = 16384


@settings(max_examples=120)
@given(st.integers(0, 70_000), st.lists(OP, min_size=1, max_size=25))
def test_data_never_exceeds_the_windows_and_held_bytes_are_exact(initial, ops):
    async def main():
        budget = HeldBudget()
        p = Peer(_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, initial),
                 limits=Limits(conn_held_max=100_000), budget=budget)
        w = Window(initial)
        sids = []
        seen = [0]

        def check():
            frames = p.read()
            new, seen[0] = frames[seen[0]:], len(frames)
            for kind, flags, sid, payload in new:
                if sid in w.ended and kind in (h2.DATA, h2.HEADERS):
                    raise AssertionError(f"frame {kind} on stream {sid} after its end")
                if kind == h2.DATA:
                    n = len(payload)
                    assert n <= w.max_frame
                    assert n <= w.conn, (n, w.conn)
                    assert n <= w.streams[sid], (n, w.streams[sid])
                    w.conn -= n
                    w.streams[sid] -= n
                if kind in (h2.DATA, h2.HEADERS) and flags & h2.END_STREAM or \
                        kind == h2.RST_STREAM and sid:
                    w.ended.add(sid)
            conn = p.conn
            assert conn.held == sum(s.pending_bytes for s in conn.streams.values())
            assert budget.held == conn.held
            assert conn.held <= 100_000 + 70_010  # the bound, and one reply past it

        for op in ops:
            note(repr(op))
            kind = op[0]
            if kind in ("big", "chunks"):
                sid = 1 + 2 * len(sids)
                sids.append(sid)
                w.streams[sid] = w.initial
                p.request(sid, "/s/Big" if kind == "big" else "/s/Chunks", b"%d" % op[1])
            elif kind == "conn_update":
                w.conn += op[1]
                p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", op[1])))
            elif kind == "stream_update" and sids:
                sid = sids[op[1] % len(sids)]
                if sid not in w.ended:
                    w.streams[sid] += op[2]
                p.send(h2.frame(h2.WINDOW_UPDATE, 0, sid, struct.pack(">I", op[2])))
            elif kind == "initial":
                delta = op[1] - w.initial
                w.initial = op[1]
                for sid in w.streams:
                    w.streams[sid] += delta
                p.send(h2.frame(h2.SETTINGS, 0, 0,
                                struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, op[1])))
            elif kind == "frame":
                w.max_frame = op[1]
                p.send(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.MAX_FRAME_SIZE,
                                                                op[1])))
            elif kind == "reset" and sids:
                sid = sids[op[1] % len(sids)]
                p.send(h2.frame(h2.RST_STREAM, 0, sid, struct.pack(">I", h2.CANCEL)))
                w.ended.add(sid)
            for _ in range(6):
                await asyncio.sleep(0)
            check()
        assert not p.transport.closed, p.read()

    asyncio.run(main())
