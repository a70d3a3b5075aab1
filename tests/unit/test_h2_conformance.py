"""RFC 9113 and RFC 7541 conformance of the native HTTP/2 transport, case by case as
h2spec runs them (its section numbers name the tests), driven in process: the `h2`
package (python-hyper) is the client and writes what it will write, raw frames the
rest. Each case expects the error code the RFC names: a connection error is a GOAWAY
with that code and a closed transport, a stream error an RST_STREAM with it and the
connection still serving (a PING is answered afterwards).
"""

from __future__ import annotations

import asyncio
import functools
import struct

import h2.config
import h2.connection
import pytest

from frontend.transport import h2 as srv
from tests.unit.test_h2 import Peer, _echo_handlers

pytestmark = pytest.mark.timeout(30)


def arun(fn):
    """Run an async test (and its parameters) on a fresh event loop."""
    @functools.wraps(fn)
    def test(*args, **kwargs):
        asyncio.run(fn(*args, **kwargs))
    return test

U32 = struct.Struct(">I")
REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/s/Echo"),
           (b":authority", b"x"), (b"content-type", b"application/grpc"),
           (b"te", b"trailers")]
SLOW = [(n, b"/s/Slow" if n == b":path" else v) for n, v in REQUEST]
MESSAGE = b"\x00\x00\x00\x00\x02hi"


class Client:
    """The `h2` package's client connection, wired to a GrpcConnection in process."""

    def __init__(self, started=None, limits=None):
        self.peer = Peer(_echo_handlers(started), preface=False, limits=limits)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False))
        self.h2.initiate_connection()  # the preface and SETTINGS
        self.flush()

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.peer.send(data)

    def raw(self, data: bytes):
        self.peer.send(data)

    def block(self, headers) -> bytes:
        """A header block from the client's own encoder (its table stays in step)."""
        return self.h2.encoder.encode(headers)

    def headers(self, sid, headers=REQUEST, end=True):
        self.h2.send_headers(sid, headers, end_stream=end)
        self.flush()

    def request(self, sid, headers=REQUEST):
        self.headers(sid, headers, end=False)
        self.h2.send_data(sid, MESSAGE, end_stream=True)
        self.flush()

    def frames(self, kind):
        return [f for f in self.peer.read() if f[0] == kind]

    def goaway_code(self):
        goaways = self.frames(srv.GOAWAY)
        return U32.unpack(goaways[-1][3][4:8])[0] if goaways else None

    def rst_codes(self, sid):
        return [U32.unpack(f[3])[0] for f in self.frames(srv.RST_STREAM) if f[2] == sid]

    @property
    def closed(self):
        return self.peer.transport.closed

    async def settle(self):
        await self.peer.settle()


def connection_error(c: Client, code: int):
    assert c.goaway_code() == code and c.closed, (c.goaway_code(), c.closed)


def stream_error(c: Client, sid: int, code: int):
    assert code in c.rst_codes(sid), c.rst_codes(sid)
    assert not c.closed and c.goaway_code() is None
    c.raw(srv.frame(srv.PING, 0, 0, b"stillok!"))  # and the connection serves on
    assert (srv.PING, srv.ACK, 0, b"stillok!") in c.peer.read()


def served(c: Client, sid: int):
    heads = [f for f in c.frames(srv.HEADERS) if f[2] == sid]
    assert heads and heads[-1][3].get("grpc-status") == "0", heads


# -- 3.5 the connection preface, and SETTINGS first (RFC 9113 3.4) -----------------------

@arun
async def test_3_5_an_invalid_preface_is_a_protocol_error():
    p = Peer(_echo_handlers(), preface=False)
    p.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + srv.frame(srv.SETTINGS, 0, 0))
    assert p.transport.closed
    goaway = [f for f in p.read() if f[0] == srv.GOAWAY]
    assert U32.unpack(goaway[-1][3][4:8])[0] == srv.PROTOCOL_ERROR


@pytest.mark.parametrize("first", [
    srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM, 1, b"\x83\x86\x84"),
    srv.frame(srv.PING, 0, 0, b"12345678"),
    srv.frame(srv.SETTINGS, srv.ACK, 0),
])
@arun
async def test_3_4_the_first_frame_after_the_preface_must_be_settings(first):
    p = Peer(_echo_handlers(), preface=False)
    p.send(srv.PREFACE + first)
    assert p.transport.closed
    goaway = [f for f in p.read() if f[0] == srv.GOAWAY]
    assert U32.unpack(goaway[-1][3][4:8])[0] == srv.PROTOCOL_ERROR
    assert not [f for f in p.frames if f[0] == srv.RST_STREAM]


# -- 4.1 frame format, 4.2 frame size, 4.3 header compression ----------------------------

@arun
async def test_4_1_unknown_types_undefined_flags_and_the_reserved_bit_are_ignored():
    c = Client()
    c.raw(srv.frame(0x16, 0, 0, b"\0" * 8) + srv.frame(srv.PING, 0x16, 0, b"abcdefgh")
          + srv.frame(srv.PING, 0, 0x80000000, b"ijklmnop"))
    pings = c.frames(srv.PING)
    assert [p[3] for p in pings] == [b"abcdefgh", b"ijklmnop"] and not c.closed


@arun
async def test_4_2_a_data_frame_of_2_to_the_14_octets_is_served():
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame(srv.DATA, srv.END_STREAM, 1,
                    struct.pack(">BI", 0, 16379) + b"x" * 16379))
    await c.settle()
    served(c, 1)


@pytest.mark.parametrize("kind", [srv.DATA, srv.HEADERS])
@arun
async def test_4_2_a_frame_past_max_frame_size_is_a_frame_size_error(kind):
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame_head(srv.RECV_MAX_FRAME + 1, kind, 0, 1))
    connection_error(c, srv.FRAME_SIZE_ERROR)


@arun
async def test_4_3_an_invalid_header_block_is_a_compression_error():
    c = Client()
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS, 1, b"\x80"))
    connection_error(c, srv.COMPRESSION_ERROR)


@pytest.mark.parametrize("between", [
    srv.frame(srv.PRIORITY_FRAME, 0, 1, b"\0\0\0\0\x10"),
    srv.frame(srv.HEADERS, srv.END_HEADERS, 3, b"\x82"),
    srv.frame(0x16, 0, 0, b"\0" * 8),  # 5.5: an unknown frame in a header block
    srv.frame(srv.DATA, 0, 1, b"x"),  # 6.10: CONTINUATION preceded by DATA
])
@arun
async def test_4_3_only_continuation_may_follow_an_unfinished_header_block(between):
    c = Client()
    block = c.block(REQUEST)
    c.raw(srv.frame(srv.HEADERS, 0, 1, block[:3]) + between
          + srv.frame(srv.CONTINUATION, srv.END_HEADERS, 1, block[3:]))
    connection_error(c, srv.PROTOCOL_ERROR)


# -- 5.1 stream states --------------------------------------------------------------------

@pytest.mark.parametrize("frame", [
    srv.frame(srv.DATA, 0, 1, b"x"),
    srv.frame(srv.RST_STREAM, 0, 1, U32.pack(srv.CANCEL)),
    srv.frame(srv.WINDOW_UPDATE, 0, 1, U32.pack(100)),
    srv.frame(srv.CONTINUATION, srv.END_HEADERS, 1, b"\x82"),
])
@arun
async def test_5_1_frames_on_an_idle_stream_are_protocol_errors(frame):
    c = Client()
    c.raw(frame)
    connection_error(c, srv.PROTOCOL_ERROR)


async def _half_closed_remote(c: Client, started):
    c.headers(1, SLOW, end=False)
    c.h2.send_data(1, b"\0\0\0\0\0", end_stream=True)
    c.flush()
    return await asyncio.wait_for(started, 5)


@arun
async def test_5_1_half_closed_remote_data_and_headers_are_stream_closed():
    for extra in (lambda c: srv.frame(srv.DATA, 0, 1, b"x"),
                  lambda c: srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM, 1,
                                      c.block([(b"x-trailer", b"1")]))):
        started = asyncio.get_running_loop().create_future()
        c = Client(started)
        context = await _half_closed_remote(c, started)
        c.raw(extra(c))
        await c.settle()
        stream_error(c, 1, srv.STREAM_CLOSED)
        assert context.cancelled()  # the handler was stopped with its stream


@arun
async def test_5_1_half_closed_remote_continuation_is_a_protocol_error():
    started = asyncio.get_running_loop().create_future()
    c = Client(started)
    await _half_closed_remote(c, started)
    c.raw(srv.frame(srv.CONTINUATION, srv.END_HEADERS, 1, b"\x82"))
    connection_error(c, srv.PROTOCOL_ERROR)


@arun
async def test_5_1_closed_by_the_peers_reset_data_is_stream_closed_headers_end_all():
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame(srv.RST_STREAM, 0, 1, U32.pack(srv.CANCEL))
          + srv.frame(srv.DATA, 0, 1, b"x"))
    stream_error(c, 1, srv.STREAM_CLOSED)
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM, 1, c.block(REQUEST)))
    connection_error(c, srv.STREAM_CLOSED)


@arun
async def test_5_1_closed_after_both_ends_data_is_stream_closed_headers_end_all():
    c = Client()
    c.request(1)
    await c.settle()
    served(c, 1)
    c.raw(srv.frame(srv.DATA, 0, 1, b"x"))
    stream_error(c, 1, srv.STREAM_CLOSED)
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS, 1, c.block(REQUEST)))
    connection_error(c, srv.STREAM_CLOSED)


@arun
async def test_5_1_frames_on_a_stream_the_server_reset_are_ignored():
    """RFC 9113 5.1 closed: frames the peer sent before it saw our RST_STREAM are
    ignored, trailers included (their block still goes through the decoder)."""
    c = Client()
    c.headers(1, [(n, b"/s/Nope" if n == b":path" else v) for n, v in REQUEST], end=False)
    await c.settle()
    assert c.rst_codes(1) == [srv.NO_ERROR]  # answered (UNIMPLEMENTED) before its end
    c.raw(srv.frame(srv.DATA, 0, 1, b"late data")
          + srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM, 1,
                      c.block([(b"x-t", b"1")])))
    c.request(3)
    await c.settle()
    served(c, 3)
    assert c.rst_codes(1) == [srv.NO_ERROR] and not c.closed


@arun
async def test_5_1_1_even_and_decreasing_stream_ids_are_protocol_errors():
    c = Client()
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS, 2, c.block(REQUEST)))
    connection_error(c, srv.PROTOCOL_ERROR)
    c = Client()
    c.headers(5)
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS, 4, c.block(REQUEST)))
    connection_error(c, srv.PROTOCOL_ERROR)


@arun
async def test_5_1_2_streams_past_max_concurrent_streams_are_refused():
    started = asyncio.get_running_loop().create_future()
    c = Client(started, limits=srv.Limits(max_streams=3))
    settings = c.frames(srv.SETTINGS)[0][3]
    assert (srv.MAX_CONCURRENT_STREAMS, 3) in [struct.unpack_from(">HI", settings, i)
                                                for i in range(0, len(settings), 6)]
    for sid in (1, 3, 5, 7):
        c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS, sid, c.block(SLOW)))
    stream_error(c, 7, srv.REFUSED_STREAM)
    assert sorted(c.peer.conn.streams) == [1, 3, 5]


@arun
async def test_5_3_1_a_stream_depending_on_itself_is_a_protocol_error():
    c = Client()
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM | srv.PRIORITY, 1,
                    U32.pack(1) + b"\x10" + c.block(REQUEST)))
    stream_error(c, 1, srv.PROTOCOL_ERROR)
    c.request(3)  # the decoder followed the refused block: its table is right
    await c.settle()
    served(c, 3)
    c.raw(srv.frame(srv.PRIORITY_FRAME, 0, 3, U32.pack(3) + b"\x10"))
    stream_error(c, 3, srv.PROTOCOL_ERROR)
    c.raw(srv.frame(srv.PRIORITY_FRAME, 0, 7, U32.pack(7) + b"\x10"))
    connection_error(c, srv.PROTOCOL_ERROR)  # no RST_STREAM on an idle stream


@pytest.mark.parametrize("ping", [srv.frame(srv.PING, 0, 0, b"1234567"),
                                  srv.frame(srv.PING, 0, 0, b"123456789")])
@arun
async def test_5_4_1_an_invalid_ping_ends_the_connection_with_goaway(ping):
    c = Client()
    c.raw(ping)
    connection_error(c, srv.FRAME_SIZE_ERROR)


# -- 6.x frame definitions -----------------------------------------------------------------

@pytest.mark.parametrize("frame, code", [
    (srv.frame(srv.DATA, 0, 0, b"x"), srv.PROTOCOL_ERROR),  # 6.1
    (srv.frame(srv.HEADERS, srv.END_HEADERS, 0, b"\x82"), srv.PROTOCOL_ERROR),  # 6.2
    (srv.frame(srv.PRIORITY_FRAME, 0, 0, b"\0\0\0\0\x10"), srv.PROTOCOL_ERROR),  # 6.3
    (srv.frame(srv.RST_STREAM, 0, 0, U32.pack(0)), srv.PROTOCOL_ERROR),  # 6.4
    (srv.frame(srv.RST_STREAM, 0, 1, b"\0\0\0"), srv.FRAME_SIZE_ERROR),  # 6.4
    (srv.frame(srv.SETTINGS, srv.ACK, 0, b"\0" * 6), srv.FRAME_SIZE_ERROR),  # 6.5
    (srv.frame(srv.SETTINGS, 0, 1, b""), srv.PROTOCOL_ERROR),  # 6.5
    (srv.frame(srv.SETTINGS, 0, 0, b"\0" * 5), srv.FRAME_SIZE_ERROR),  # 6.5
    (srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.ENABLE_PUSH, 2)),
     srv.PROTOCOL_ERROR),  # 6.5.2
    (srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.INITIAL_WINDOW_SIZE, 2**31)),
     srv.FLOW_CONTROL_ERROR),  # 6.5.2, 6.9.2
    (srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.MAX_FRAME_SIZE, 16383)),
     srv.PROTOCOL_ERROR),  # 6.5.2
    (srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.MAX_FRAME_SIZE, 1 << 24)),
     srv.PROTOCOL_ERROR),  # 6.5.2
    (srv.frame(srv.PING, 0, 1, b"12345678"), srv.PROTOCOL_ERROR),  # 6.7
    (srv.frame(srv.GOAWAY, 0, 1, b"\0" * 8), srv.PROTOCOL_ERROR),  # 6.8
    (srv.frame(srv.WINDOW_UPDATE, 0, 0, U32.pack(0)), srv.PROTOCOL_ERROR),  # 6.9
    (srv.frame(srv.WINDOW_UPDATE, 0, 0, b"\0\0\0"), srv.FRAME_SIZE_ERROR),  # 6.9
    (srv.frame(srv.CONTINUATION, srv.END_HEADERS, 0, b"\x82"), srv.PROTOCOL_ERROR),
    (srv.frame(srv.PUSH_PROMISE, srv.END_HEADERS, 1, b"\0\0\0\x02\x82"),
     srv.PROTOCOL_ERROR),  # 8.2
])
@arun
async def test_6_connection_errors_of_frame_definitions(frame, code):
    c = Client()
    c.raw(frame)
    connection_error(c, code)


@arun
async def test_6_1_and_6_2_bad_padding_is_a_protocol_error():
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame(srv.DATA, srv.PADDED, 1, b"\x05abc"))
    connection_error(c, srv.PROTOCOL_ERROR)
    c = Client()
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS | srv.PADDED, 1,
                    b"\x40" + c.block(REQUEST)))
    connection_error(c, srv.PROTOCOL_ERROR)


@arun
async def test_6_3_a_priority_frame_of_the_wrong_length_is_a_stream_error():
    c = Client()
    c.request(1)
    c.raw(srv.frame(srv.PRIORITY_FRAME, 0, 1, b"\0\0\0\0"))
    stream_error(c, 1, srv.FRAME_SIZE_ERROR)
    c.raw(srv.frame(srv.PRIORITY_FRAME, 0, 3, b"\0\0\0\0"))
    connection_error(c, srv.FRAME_SIZE_ERROR)  # on an idle stream


@arun
async def test_6_5_unknown_settings_are_ignored_and_every_settings_frame_acked():
    c = Client()
    c.peer.read()
    c.raw(srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", 0xFF, 1)))
    assert [f for f in c.frames(srv.SETTINGS) if f[1] & srv.ACK]


@arun
async def test_6_5_3_the_last_of_several_initial_window_sizes_counts():
    c = Client()
    c.raw(srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HIHI", srv.INITIAL_WINDOW_SIZE, 100,
                                                      srv.INITIAL_WINDOW_SIZE, 1)))
    c.request(1)
    await c.settle()
    data = [f for f in c.frames(srv.DATA) if f[2] == 1]
    assert [len(f[3]) for f in data] == [1]


@pytest.mark.parametrize("increments, code", [
    ([0], srv.PROTOCOL_ERROR), ([2**31 - 1, 2**31 - 1], srv.FLOW_CONTROL_ERROR)])
@arun
async def test_6_9_window_updates_zero_and_overflowing_on_a_stream_are_stream_errors(
        increments, code):
    c = Client()
    c.headers(1, end=False)
    c.raw(b"".join(srv.frame(srv.WINDOW_UPDATE, 0, 1, U32.pack(i)) for i in increments))
    stream_error(c, 1, code)


@arun
async def test_6_9_1_a_connection_window_past_2_to_the_31_is_a_flow_control_error():
    c = Client()
    c.raw(srv.frame(srv.WINDOW_UPDATE, 0, 0, U32.pack(2**31 - 1))
          + srv.frame(srv.WINDOW_UPDATE, 0, 0, U32.pack(2**31 - 1)))
    connection_error(c, srv.FLOW_CONTROL_ERROR)


@arun
async def test_6_9_2_initial_window_changes_apply_to_open_streams_even_below_zero():
    c = Client()
    c.raw(srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.INITIAL_WINDOW_SIZE, 3)))
    c.request(1)
    await c.settle()
    assert [len(f[3]) for f in c.frames(srv.DATA) if f[2] == 1] == [3]
    # window 3 - 3 = 0; a SETTINGS of 1 takes it to -2; +3 lets one byte out
    c.raw(srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.INITIAL_WINDOW_SIZE, 1)))
    await c.settle()
    assert c.peer.conn.streams[1].send_window == -2
    c.raw(srv.frame(srv.WINDOW_UPDATE, 0, 1, U32.pack(3)))
    await c.settle()
    assert [len(f[3]) for f in c.frames(srv.DATA) if f[2] == 1] == [3, 1]


@arun
async def test_6_9_2_settings_that_push_an_open_stream_window_past_the_maximum():
    c = Client()
    c.headers(1, SLOW, end=False)
    c.raw(srv.frame(srv.WINDOW_UPDATE, 0, 1, U32.pack(2**31 - 1 - 65535))
          + srv.frame(srv.SETTINGS, 0, 0, struct.pack(">HI", srv.INITIAL_WINDOW_SIZE,
                                                       65536)))
    connection_error(c, srv.FLOW_CONTROL_ERROR)


@arun
async def test_6_9_data_past_the_receive_windows_is_a_flow_control_error(monkeypatch):
    """We give windows back at half: only a peer that sends more than was ever granted
    between two of our WINDOW_UPDATEs breaks them (windows made small to show it)."""
    monkeypatch.setattr(srv, "RECV_STREAM_WINDOW", 128 << 10)
    monkeypatch.setattr(srv, "RECV_CONN_WINDOW", 256 << 10)
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame(srv.DATA, 0, 1, b"x" * (100 << 10)))
    assert not c.rst_codes(1)
    c.raw(srv.frame(srv.DATA, 0, 1, b"x" * (129 << 10)))  # past the stream's window
    stream_error(c, 1, srv.FLOW_CONTROL_ERROR)
    c.headers(3, end=False)
    c.headers(5, end=False)
    c.raw(srv.frame(srv.DATA, 0, 3, b"x" * (100 << 10))
          + srv.frame(srv.DATA, 0, 5, b"x" * (100 << 10))
          + srv.frame(srv.DATA, 0, 3, b"x" * (100 << 10)))  # past the connection's
    connection_error(c, srv.FLOW_CONTROL_ERROR)


@pytest.mark.parametrize("frame", [
    srv.frame(srv.GOAWAY, 0, 0, b"\0\0\0\0\0\0\xff\xff"),
    srv.frame(srv.RST_STREAM, 0, 1, b"\0\0\xff\xff"),
])
@arun
async def test_7_unknown_error_codes_are_not_errors(frame):
    c = Client()
    c.headers(1, SLOW, end=False)
    c.raw(frame + srv.frame(srv.PING, 0, 0, b"12345678"))
    assert [f[3] for f in c.frames(srv.PING)] == [b"12345678"]


# -- 8.1 HTTP message exchanges --------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    REQUEST + [(b"X-Upper", b"1")],  # 8.1.2
    REQUEST + [(b":test", b"1")],  # 8.1.2.1
    [(b":status", b"200")] + REQUEST,
    REQUEST[:2] + [(b"x-a", b"1")] + REQUEST[2:],
    REQUEST + [(b"connection", b"keep-alive")],  # 8.1.2.2
    REQUEST[:5] + [(b"te", b"trailers, deflate")],
    [(n, b"" if n == b":path" else v) for n, v in REQUEST],  # 8.1.2.3
    REQUEST[1:],
    [h for h in REQUEST if h[0] != b":scheme"],
    [h for h in REQUEST if h[0] != b":path"],
    REQUEST[:1] + REQUEST,
    REQUEST[:2] + REQUEST[1:],
    REQUEST[:3] + REQUEST[2:],
])
@arun
async def test_8_1_malformed_requests_are_stream_protocol_errors(headers):
    c = Client()
    c.headers(1, headers)
    stream_error(c, 1, srv.PROTOCOL_ERROR)


@pytest.mark.parametrize("trailers, flags", [
    ([(b"x-t", b"1")], srv.END_HEADERS),
    ([(b":path", b"/x")], srv.END_HEADERS | srv.END_STREAM)])
@arun
async def test_8_1_trailers_must_end_the_stream_and_hold_no_pseudo_headers(trailers, flags):
    c = Client()
    c.headers(1, end=False)
    c.raw(srv.frame(srv.HEADERS, flags, 1, c.block(trailers)))
    stream_error(c, 1, srv.PROTOCOL_ERROR)


@pytest.mark.parametrize("bodies", [[b"12345"], [b"12", b"345"]])
@arun
async def test_8_1_2_6_a_content_length_the_data_does_not_match(bodies):
    c = Client()
    c.headers(1, REQUEST + [(b"content-length", b"4")], end=False)
    for i, body in enumerate(bodies):
        last = i == len(bodies) - 1
        c.raw(srv.frame(srv.DATA, srv.END_STREAM if last else 0, 1, body))
    stream_error(c, 1, srv.PROTOCOL_ERROR)


@arun
async def test_8_1_2_6_a_content_length_the_data_matches_is_served():
    c = Client()
    c.headers(1, REQUEST + [(b"content-length", b"%d" % len(MESSAGE))], end=False)
    c.raw(srv.frame(srv.DATA, srv.END_STREAM, 1, MESSAGE))
    await c.settle()
    served(c, 1)


# -- RFC 7541 through the connection -------------------------------------------------------

@pytest.mark.parametrize("block", [
    b"\xbe",  # 2.3.3: indexed field past the table
    b"\x7f\x00\x01v",  # 2.3.3: literal whose name index is past the table
    b"\x82\x3f\xe1\x1f",  # 4.2: size update at the end of a block
    b"\x00\x81\x1f\xff\x01v",  # 5.2: Huffman padding longer than 7 bits
    b"\x00\x81\x00\x01v",  # 5.2: Huffman padded with zeros
    b"\x00\x84\xff\xff\xff\xff\x01v",  # 5.2: Huffman EOS
    b"\x80",  # 6.1: index 0
    b"\x3f\xe2\x1f\x82",  # 6.3: size update past SETTINGS_HEADER_TABLE_SIZE
])
@arun
async def test_hpack_errors_are_compression_errors(block):
    c = Client()
    c.raw(srv.frame(srv.HEADERS, srv.END_HEADERS | srv.END_STREAM, 1, block))
    connection_error(c, srv.COMPRESSION_ERROR)


@arun
async def test_we_advertise_our_header_limits_and_no_push():
    c = Client()
    settings = c.frames(srv.SETTINGS)[0][3]
    values = dict(struct.unpack_from(">HI", settings, i) for i in range(0, len(settings), 6))
    assert values[srv.MAX_HEADER_LIST_SIZE] == 16384
    assert values[srv.HEADER_TABLE_SIZE] == 4096 and values[srv.ENABLE_PUSH] == 0
    assert values[srv.MAX_CONCURRENT_STREAMS] == 250
