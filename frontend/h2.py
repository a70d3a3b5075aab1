"""HTTP/2 server connections (RFC 9113) on an asyncio Protocol, for the native gRPC
frontend (frontend/grpc_native.py); cleartext with prior knowledge, as gRPC uses it.

`H2Connection` parses frames and keeps each stream's state and both directions of
flow control; a subclass gets the requests through four hooks (`stream_opened`,
`stream_data`, `stream_ended`, `stream_reset`) and answers with `send_headers`,
`send_data` and `send_trailers`, which never block: data beyond what the peer's
windows allow waits in the stream and goes out as WINDOW_UPDATEs arrive, in frames
no larger than the peer's MAX_FRAME_SIZE. What the hooks produce while one read is
handled goes out in one transport.write; what they produce later (a handler that
finished) is gathered until the loop's next turn, so replies finishing together
share a write too.

Request headers are decoded with `hpack` (one decoder per connection: its dynamic
table is the connection's), behind a cache of the blocks whose decoding leaves that
table alone (`HeaderDecoder`): a client sends the same few bytes for every call once
its headers are indexed. Response headers are written as literals without indexing, so
no encoder state is needed and constant blocks are built once.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import hpack

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20

# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)

# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, \
    STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = range(10)
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1

# What this server advertises. Large receive windows keep a 64 MiB request from
# waiting on round trips; what is read is given back once half a window is used.
RECV_STREAM_WINDOW = 1 << 24
RECV_CONN_WINDOW = 1 << 26
RECV_MAX_FRAME = 1 << 20
WRITELINES_MIN = 1 << 16  # bytes of pending frames written without joining them
MAX_STREAMS = 4096
MAX_HEADER_BLOCK = 1 << 20  # a request's headers, CONTINUATIONs included
STREAM_WRITE_HIGH = 1 << 20  # a stream holding more unsent bytes makes writers wait

_HEAD = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
_U32 = struct.Struct(">I")


class ConnectionError_(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def frame_head(length: int, kind: int, flags: int, stream: int) -> bytes:
    return _HEAD.pack((length << 8) | kind, flags, stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack((len(payload) << 8) | kind, flags, stream) + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: `value` with an N-bit prefix; `first` holds the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing with a new name, no Huffman."""
    return (b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value)


class Stream:
    """One HTTP/2 stream, as the server sees it."""

    __slots__ = ("id", "send_window", "recv_unacked", "pending", "pending_bytes",
                 "trailers", "remote_closed", "local_closed", "headers_sent",
                 "waiter", "app")

    def __init__(self, sid: int, send_window: int):
        self.id = sid
        self.send_window = send_window
        self.recv_unacked = 0
        self.pending: list[memoryview] = []  # data waiting for window
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # header block to send once pending is out
        self.remote_closed = False
        self.local_closed = False
        self.headers_sent = False
        self.waiter: asyncio.Future | None = None  # a writer waiting for room
        self.app = None  # the layer above's per-stream state


def _read_int(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 5.1) at `pos`: (value, position after it)."""
    mask = (1 << prefix_bits) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def leaves_table_alone(block: bytes) -> bool:
    """Whether decoding the (well-formed) header block changes no dynamic table: it
    holds only indexed fields and literals without indexing or never indexed (RFC 7541
    6.1, 6.2.2, 6.2.3), no literal with incremental indexing (6.2.1) and no dynamic
    table size update (6.3)."""
    try:
        pos, end = 0, len(block)
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field
                pos = _read_int(block, pos, 7)[1]
            elif first & 0xC0 == 0x40 or first & 0xE0 == 0x20:
                return False
            else:  # a literal field not indexed: name by index, or as a string
                index, pos = _read_int(block, pos, 4)
                if index == 0:
                    length, pos = _read_int(block, pos, 7)
                    pos += length
                length, pos = _read_int(block, pos, 7)
                pos += length
        return pos == end
    except IndexError:
        return False


class HeaderDecoder:
    """A connection's HPACK decoder with a cache of decoded blocks.

    hpack decodes in pure Python: 14 us for a block of eight indexed fields, more with
    Huffman-coded literals, per call. Once a client's headers are in the dynamic table
    its calls send identical blocks, and a block that leaves the table alone decodes
    the same for as long as the table stays as it is: such blocks are kept, and the
    cache is emptied whenever a block changes the table (a literal with incremental
    indexing, a size update). A cached block is never decoded again, which is right
    only because decoding it had no effect on the table. Small blocks only, a bounded
    number: a client cannot make the cache hold much."""

    CACHE_BLOCKS = 64
    CACHE_BLOCK_BYTES = 4096

    def __init__(self):
        self.hpack = hpack.Decoder()
        self.hpack.max_header_list_size = 1 << 24
        self.cache: dict[bytes, tuple] = {}

    def decode(self, block) -> tuple:
        """[(name, value)] as bytes, as hpack's decode(raw=True) gives them."""
        if type(block) is not bytes:
            block = bytes(block)
        headers = self.cache.get(block)
        if headers is not None:
            return headers
        headers = tuple(self.hpack.decode(block, raw=True))
        if not leaves_table_alone(block):
            self.cache.clear()  # cached blocks may name entries that moved
        elif len(block) <= self.CACHE_BLOCK_BYTES:
            if len(self.cache) >= self.CACHE_BLOCKS:
                self.cache.clear()
            self.cache[block] = headers
        return headers


class H2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection; subclass and fill in the hooks."""

    def __init__(self):
        self.decoder = HeaderDecoder()
        self.buf = bytearray()
        self.preface = False
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0  # highest stream id the client opened
        self.continuing: tuple[Stream | None, int, bytearray] | None = None
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.recv_unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with data waiting for window
        self.out: list = []
        self.flush_scheduled = False
        self.reading = False
        self.write_paused = False
        self.resume_waiters: list[asyncio.Future] = []
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.transport = None
        self.loop = None
        # -- keepalive hook (frontend/h2_keepalive.py): a ConnectionPolicy, and two
        # flags it reads and clears on its own timers, so frames cost a store at most
        self.policy = None
        self.bytes_read = False  # anything read from the client
        self.data_sent = False  # HEADERS, DATA or a connection WINDOW_UPDATE queued

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        settings = (struct.pack(">HI", INITIAL_WINDOW_SIZE, RECV_STREAM_WINDOW)
                    + struct.pack(">HI", MAX_FRAME_SIZE, RECV_MAX_FRAME)
                    + struct.pack(">HI", MAX_CONCURRENT_STREAMS, MAX_STREAMS)
                    + struct.pack(">HI", ENABLE_PUSH, 0))
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0,
                                _U32.pack(RECV_CONN_WINDOW - DEFAULT_WINDOW)))

    def data_received(self, data: bytes) -> None:
        self.bytes_read = True  # keepalive hook
        buf = self.buf
        buf += data
        pos = 0
        self.reading = True
        try:
            if not self.preface:
                if len(buf) < 24:
                    if not PREFACE.startswith(bytes(buf)):
                        self.transport.close()
                    return
                if buf[:24] != PREFACE:
                    self.transport.close()
                    return
                self.preface, pos = True, 24
            end = len(buf)
            head = _HEAD.unpack_from
            while end - pos >= 9:
                word, flags, sid = head(buf, pos)
                length = word >> 8
                if length > RECV_MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame too large")
                if end - pos - 9 < length:
                    break
                start = pos + 9
                pos = start + length
                self.on_frame(word & 0xFF, flags, sid & 0x7FFFFFFF, buf, start, pos)
            del buf[:pos]
        except ConnectionError_ as e:
            log.debug("HTTP/2 connection error: %s", e)
            self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, e.code)
                                  + str(e).encode()))
            self._write_out()
            self.transport.close()
            return
        finally:
            self.reading = False
        if self.recv_unacked >= RECV_CONN_WINDOW >> 1:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0
            self.data_sent = True  # keepalive hook (grpc-core resets its ping clock)
        if self.out:
            self._write_out()

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        waiters, self.resume_waiters = self.resume_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def connection_lost(self, exc) -> None:
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        for st in streams.values():
            self._wake(st)
            self.stream_reset(st)
        for w in self.resume_waiters:
            if not w.done():
                w.set_result(None)
        self.resume_waiters = []
        if self.policy is not None:  # keepalive hook: its timers go with the connection
            self.policy.close()
        self.connection_closed()

    # -- hooks ------------------------------------------------------------------------

    def stream_opened(self, stream: Stream, headers: list, end_stream: bool) -> None:
        """Request headers arrived (`headers`: [(name, value)] as bytes)."""

    def stream_data(self, stream: Stream, data: memoryview) -> None:
        """A DATA frame's content (padding removed); valid only during the call."""

    def stream_ended(self, stream: Stream) -> None:
        """The client half-closed the stream (END_STREAM)."""

    def stream_reset(self, stream: Stream) -> None:
        """The stream was reset by the client or the connection was lost."""

    def connection_closed(self) -> None:
        """The connection is gone; every stream was reset first."""

    # -- frames in --------------------------------------------------------------------

    def on_frame(self, kind: int, flags: int, sid: int, buf: bytearray, start: int,
                 end: int) -> None:
        if self.continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, sid, buf, start, end)
        elif kind == HEADERS:
            self._on_headers(flags, sid, bytes(buf[start:end]))
        elif kind == CONTINUATION:
            if self.continuing is None or self.continuing[0] is None and sid == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
            st, end_stream, block = self.continuing
            block += buf[start:end]
            if len(block) > MAX_HEADER_BLOCK:  # a CONTINUATION flood: memory, not headers
                raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
            if flags & END_HEADERS:
                self.continuing = None
                self._headers_done(sid, st, end_stream, bytes(block))
        elif kind == SETTINGS:
            if sid:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
            if not flags & ACK:
                grew = self._on_settings(bytes(buf[start:end]))
                # the ACK goes before any DATA the new values allow: a peer that
                # raised its window counts on it only once acknowledged (grpc-core
                # resets the stream: "frame of size 5 overflows local window of 0")
                self.out.append(frame(SETTINGS, ACK, 0))
                if grew:
                    self._pump_blocked()
        elif kind == WINDOW_UPDATE:
            if end - start != 4:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
            self._on_window_update(sid, _U32.unpack_from(buf, start)[0] & 0x7FFFFFFF)
        elif kind == PING:
            if end - start != 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad PING")
            if not flags & ACK:
                # keepalive hook: PINGs too often -> GOAWAY, as grpc-core words it
                if self.policy is not None and self.policy.ping_received():
                    raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")
                self.out.append(frame(PING, ACK, 0, bytes(buf[start:end])))
            elif self.policy is not None:  # keepalive hook
                self.policy.ping_acked(bytes(buf[start:end]))
        elif kind == RST_STREAM:
            st = self.streams.pop(sid, None)
            if st is not None:
                self.blocked.pop(sid, None)
                st.local_closed = st.remote_closed = True
                self._wake(st)
                self.stream_reset(st)
        elif kind == GOAWAY:
            self.going_away = True
            if not self.streams:
                self.transport.close()
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _on_data(self, flags: int, sid: int, buf, start: int, end: int) -> None:
        length = end - start
        self.recv_unacked += length  # padding counts against flow control too
        st = self.streams.get(sid)
        if st is None or st.remote_closed:
            if sid == 0 or sid > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already closed or reset: dropped, window given back
        if flags & PADDED:
            if not length:
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
            pad = buf[start]
            start += 1
            end -= pad
            if end < start:
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
        if end > start:
            self.stream_data(st, memoryview(buf)[start:end])
        if flags & END_STREAM:
            st.remote_closed = True
            self.stream_ended(st)
            self._maybe_forget(st)
        else:
            st.recv_unacked += length
            if st.recv_unacked >= RECV_STREAM_WINDOW >> 1:
                self.out.append(frame(WINDOW_UPDATE, 0, sid, _U32.pack(st.recv_unacked)))
                st.recv_unacked = 0

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        pos, end = 0, len(payload)
        if flags & PADDED:
            pos, end = 1, end - payload[0]
        if flags & PRIORITY:
            pos += 5
        if end < pos:
            raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
        block = payload[pos:end]
        st = self.streams.get(sid)
        if st is None:
            if sid <= self.last_stream or not sid & 1:
                if sid > self.last_stream:
                    raise ConnectionError_(PROTOCOL_ERROR, "even stream id")
                # trailers of a stream already reset: keep the decoder's table right
                st = None
            else:
                self.last_stream = sid
                st = Stream(sid, self.peer_initial_window)
                if self.going_away or len(self.streams) >= MAX_STREAMS:
                    st = Stream(sid, 0)
                    st.local_closed = True  # refused below, once decoded
        if not flags & END_HEADERS:
            self.continuing = (st, flags & END_STREAM, bytearray(block))
            return
        self._headers_done(sid, st, flags & END_STREAM, block)

    def _headers_done(self, sid: int, st: Stream | None, end_stream: int,
                      block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)
        except Exception as e:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {e}") from None
        if st is None:
            return
        if st.local_closed and st.id not in self.streams:  # refused
            self.out.append(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        if sid in self.streams:  # request trailers
            if end_stream and not st.remote_closed:
                st.remote_closed = True
                self.stream_ended(st)
                self._maybe_forget(st)
            return
        self.streams[sid] = st
        if end_stream:
            st.remote_closed = True
        self.stream_opened(st, headers, bool(end_stream))
        if end_stream and sid in self.streams:
            self.stream_ended(st)
            self._maybe_forget(st)

    def _on_settings(self, payload: bytes) -> bool:
        """Apply a peer's SETTINGS; True when a stream window grew (blocked data may
        go, after the ACK)."""
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad SETTINGS")
        grew = False
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for st in self.streams.values():
                    st.send_window += delta
                grew = grew or delta > 0
            elif key == MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == HEADER_TABLE_SIZE:
                pass  # our encoder never indexes: nothing to resize
        return grew

    def _on_window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if not increment:
                raise ConnectionError_(PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "window overflow")
            self._pump_blocked()
            return
        st = self.streams.get(sid)
        if st is None:
            return
        if not increment:
            self._reset(st, PROTOCOL_ERROR)
            return
        st.send_window += increment
        if st.send_window > MAX_WINDOW:
            self._reset(st, FLOW_CONTROL_ERROR)
            return
        if st.pending or st.trailers is not None:
            self._pump(st)
            self._schedule_flush()

    # -- frames out -------------------------------------------------------------------

    def send_headers(self, st: Stream, block: bytes) -> None:
        """Response headers (a header block; it must fit one frame)."""
        st.headers_sent = True
        self._header_frames(st.id, block, 0)
        self._schedule_flush()

    def send_data(self, st: Stream, data) -> None:
        """Queue `data` (bytes-like) on the stream; it goes out as windows allow."""
        if st.local_closed or not len(data):
            return
        self.data_sent = True  # keepalive hook
        view = memoryview(data).cast("B")
        if (not st.pending and len(view) <= self.send_window
                and len(view) <= st.send_window and len(view) <= self.peer_max_frame):
            # the common case: one frame, now
            n = len(view)
            self.send_window -= n
            st.send_window -= n
            self.out.append(_HEAD.pack((n << 8) | DATA, 0, st.id))
            self.out.append(view)
        else:
            st.pending.append(view)
            st.pending_bytes += len(view)
            self._pump(st)
        self._schedule_flush()

    def send_trailers(self, st: Stream, block: bytes) -> None:
        """End the stream with this header block, after whatever data is queued."""
        if st.local_closed:
            return
        st.trailers = block
        self._pump(st)
        self._schedule_flush()

    def room(self, st: Stream):
        """None when a writer may go on, else a future resolved once it may."""
        if (st.pending_bytes < STREAM_WRITE_HIGH and not self.write_paused) \
                or st.local_closed:
            return None
        fut = self.loop.create_future()
        if st.pending_bytes >= STREAM_WRITE_HIGH:
            st.waiter = fut
        else:
            self.resume_waiters.append(fut)
        return fut

    def _pump(self, st: Stream) -> None:
        out = self.out
        while st.pending:
            n = min(self.send_window, st.send_window, self.peer_max_frame)
            if n <= 0:
                self.blocked[st.id] = st
                return
            chunk = st.pending[0]
            if len(chunk) <= n:
                n = len(chunk)
                st.pending.pop(0)
            else:
                st.pending[0] = chunk[n:]
                chunk = chunk[:n]
            self.send_window -= n
            st.send_window -= n
            st.pending_bytes -= n
            self.data_sent = True  # keepalive hook
            out.append(_HEAD.pack((n << 8) | DATA, 0, st.id))
            out.append(chunk)
        self.blocked.pop(st.id, None)
        if st.waiter is not None:
            self._wake(st)
        if st.trailers is not None:
            block, st.trailers = st.trailers, None
            self._header_frames(st.id, block, END_STREAM)
            st.local_closed = True
            if not st.remote_closed:  # the answer is complete: the rest is not wanted
                out.append(frame(RST_STREAM, 0, st.id, _U32.pack(NO_ERROR)))
                st.remote_closed = True
            self._maybe_forget(st)

    def _header_frames(self, sid: int, block: bytes, flags: int) -> None:
        self.data_sent = True  # keepalive hook
        out, limit = self.out, self.peer_max_frame
        if len(block) <= limit:
            out.append(_HEAD.pack((len(block) << 8) | HEADERS, flags | END_HEADERS, sid))
            out.append(block)
            return
        kind = HEADERS
        for i in range(0, len(block), limit):
            piece = block[i:i + limit]
            last = END_HEADERS if i + limit >= len(block) else 0
            out.append(_HEAD.pack((len(piece) << 8) | kind, flags | last, sid))
            out.append(piece)
            kind, flags = CONTINUATION, 0

    def _pump_blocked(self) -> None:
        for st in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self._pump(st)
        self._schedule_flush()

    def _wake(self, st: Stream) -> None:
        w, st.waiter = st.waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    def _reset(self, st: Stream, code: int) -> None:
        self.out.append(frame(RST_STREAM, 0, st.id, _U32.pack(code)))
        self.streams.pop(st.id, None)
        self.blocked.pop(st.id, None)
        st.local_closed = st.remote_closed = True
        self._wake(st)
        self.stream_reset(st)
        self._schedule_flush()

    def _maybe_forget(self, st: Stream) -> None:
        if st.local_closed and st.remote_closed:
            self.streams.pop(st.id, None)
            self.blocked.pop(st.id, None)
            if self.going_away and not self.streams:
                self._schedule_flush()
                self.loop.call_soon(self._close_if_idle)

    def _close_if_idle(self) -> None:
        if not self.streams and self.transport is not None:
            self._write_out()
            self.transport.close()

    def send_frame(self, data: bytes) -> None:
        """Keepalive hook: queue frames built elsewhere (frontend/h2_keepalive.py's
        PINGs and GOAWAY); they go out with the next write."""
        self.out.append(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self.reading and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out:
            self._write_out()

    def _write_out(self) -> None:
        out = self.out
        if self.transport.is_closing():
            out.clear()
            return
        if len(out) == 1:
            self.transport.write(out[0])
        elif len(out) > 4 and sum(map(len, out)) >= WRITELINES_MIN:
            # a large message's frames: their headers and views of its bytes go out in
            # one vectored write (uvloop), not copied into one buffer first
            self.transport.writelines(out)
        else:
            self.transport.write(b"".join(out))
        out.clear()

    # -- stopping ---------------------------------------------------------------------

    def goaway(self) -> None:
        """Graceful stop: no new streams; close once the running ones are done."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.going_away:
            self.going_away = True
            self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream,
                                                             NO_ERROR)))
        self._write_out()
        if not self.streams:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
