"""HTTP/2 server connections (RFC 9113) on an asyncio Protocol, for the native gRPC
frontend (grpc_native.py); cleartext with prior knowledge, as gRPC uses it.

`H2Connection` parses frames and keeps each stream's state and both directions of
flow control; a subclass gets the requests through four hooks (`stream_opened`,
`stream_data`, `stream_ended`, `stream_reset`) and answers with `send_headers`,
`send_data` and `send_trailers`, which never block: data beyond what the peer's
windows allow waits in the stream and goes out as WINDOW_UPDATEs arrive, in frames
no larger than the peer's MAX_FRAME_SIZE. What the hooks produce while one read is
handled goes out in one transport.write; what they produce later (a handler that
finished) is gathered until the loop's next turn, so replies finishing together
share a write too. The writing half is H2Output (h2_send.py), the protocol's
vocabulary h2_frames.py.

Request headers are decoded by h2_hpack.py (one decoder per connection: its
dynamic table is the connection's), under a cap on the decoded list and behind a cache
of the blocks whose decoding leaves that table alone: a client sends the same few bytes
for every call once its headers are indexed. Response headers are written as literals
without indexing, so no encoder state is needed and constant blocks are built once.

A hostile peer is held to the limits of h2_limits.py (their defaults and
sources are listed there): resets and refused streams drain a token bucket, frames
that do nothing drain another, a connection whose unsent output piles up stops being
read, bytes held for closed windows are bounded per connection and per process, one
read does a bounded amount of work, and `tick(now)`, which the server calls about once
a second, applies the time limits (handshake, header block, idle, stalls). Frames are
checked as RFC 9113 says, each breach answered with the error code it names:
connection errors with GOAWAY (`_fail`), stream errors with RST_STREAM.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from shm.lifecycle import release_freed_heap

from .h2_frames import *  # noqa: F401,F403  (the vocabulary, h2.DATA and the rest)
from .h2_frames import (ACK, CONTINUATION, COMPRESSION_ERROR, DATA, DEFAULT_WINDOW,
                        ENABLE_PUSH, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM,
                        FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY, HEADER_TABLE_SIZE,
                        HEADERS, INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS,
                        MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, MAX_WINDOW, NO_ERROR,
                        PADDED, PING, PREFACE, PRIORITY, PRIORITY_FRAME, PROTOCOL_ERROR,
                        PUSH_PROMISE, RECV_CONN_WINDOW, RECV_MAX_FRAME,
                        RECV_STREAM_WINDOW, REFUSED_STREAM, RST_STREAM, SETTINGS,
                        SETTINGS_TIMEOUT, STREAM_CLOSED, WINDOW_UPDATE, ConnectionError_,
                        Stream, _HEAD, _U32, frame)
from .h2_hpack import (CompressionError, HeaderDecoder, HeaderListTooLarge, hpack_int,
                       literal, trailer_problem)
from .h2_limits import DEFAULT_LIMITS, PROCESS_BUDGET, HeldBudget, Limits, TokenBucket
from .h2_send import H2Output

__all__ = ["H2Connection", "Stream", "HeaderDecoder", "hpack_int", "literal", "frame"]

log = logging.getLogger(__name__)

MAX_STREAMS = Limits.max_streams
MAX_HEADER_BLOCK = Limits.max_header_block
# a connection that held this many reply bytes for its peer's windows at some point
# has the heap trimmed when it ends (release_freed_heap)
HEAP_TRIM_HELD = 16 << 20
# why a connection stopped reading (H2Connection.paused)
PAUSE_BURST = 1  # one read's work is done: the rest waits for the loop's next turn
PAUSE_BACKLOG = 2  # the peer does not read what we send

# what a header block, once decoded, is for
OPEN, TRAILERS, IGNORE, REFUSE = "open", "trailers", "ignore", "refuse"

_SELF_DEPENDENT = 0x100  # not a wire flag: HEADERS whose priority names its own stream
_STATUS_431 = b"\x08" + hpack_int(3, 7) + b"431"  # :status 431, literal, name indexed


class _Enough(Exception):
    """One read's work is done (H2Connection._process)."""


class H2Connection(H2Output):
    """The server side of one HTTP/2 connection; subclass and fill in the hooks.
    `limits` (h2_limits.Limits) and `budget` (the process's HeldBudget) default to
    the module's. What it sends is H2Output's (h2_send.py)."""

    # slots, as H2Output's; a subclass's own attributes go in its __dict__ (or slots)
    __slots__ = ("limits", "decoder", "buf", "preface", "settled", "streams",
                 "last_stream", "continuing", "continuing_since", "lingering",
                 "stream_cap", "recv_unacked", "recv_held", "reading", "stream_stop",
                 "paused", "going_away", "lost", "resets", "completed", "glitches", "born",
                 "idle_since", "idle_mark", "stuck_since", "held_since", "stuck_mark",
                 "held_mark", "transport", "loop", "policy", "bytes_read", "__dict__")

    def __init__(self, limits: Limits | None = None, budget: HeldBudget | None = None):
        super().__init__(budget or PROCESS_BUDGET)
        self.limits = limits = limits or DEFAULT_LIMITS
        self.decoder = HeaderDecoder(limits.max_header_list, limits.header_table_size)
        self.buf = bytearray()
        self.preface = False  # the preface and the first frame's header checked
        self.settled = False  # ... and the first SETTINGS applied
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0  # highest stream id the client opened
        # a header block in progress: (sid, stream, end_stream, what for, block, frames)
        self.continuing: tuple | None = None
        self.continuing_since = 0.0
        self.lingering = 0  # handlers still running after their stream was reset
        # streams that may be open: MAX_CONCURRENT_STREAMS less the lingering handlers,
        # 0 once GOAWAY was sent or received
        self.stream_cap = limits.max_streams
        self.recv_unacked = 0
        self.recv_held = 0  # of those, what the streams' layer above holds (hold())
        self.reading = False
        self.stream_stop = 0  # the highest stream id this read may open
        self.paused = 0  # PAUSE_* bits: why the transport is not being read
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.lost = False
        self.resets: TokenBucket | None = None
        self.completed = 0  # responses completed since the resets bucket last looked
        self.glitches: TokenBucket | None = None
        # tick()'s marks: since when the connection was idle, its output stuck, its
        # held bytes over the bound (0 = not)
        self.born = self.idle_since = 0.0
        self.idle_mark = -1
        self.stuck_since = self.held_since = 0.0
        self.stuck_mark = self.held_mark = 0
        self.transport = None
        self.loop = None
        # -- keepalive hook (h2_keepalive.py): a ConnectionPolicy, and two
        # flags it reads and clears on its own timers (H2Output.data_sent the other),
        # so frames cost a store at most
        self.policy = None
        self.bytes_read = False  # anything read from the client

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        now = self.born = self.idle_since = self.loop.time()
        lim = self.limits
        self.resets = TokenBucket(lim.reset_burst, lim.reset_rate, now)
        self.glitches = TokenBucket(lim.glitch_burst, lim.glitch_rate, now)
        settings = (struct.pack(">HI", INITIAL_WINDOW_SIZE, RECV_STREAM_WINDOW)
                    + struct.pack(">HI", MAX_FRAME_SIZE, RECV_MAX_FRAME)
                    + struct.pack(">HI", MAX_CONCURRENT_STREAMS, lim.max_streams)
                    + struct.pack(">HI", MAX_HEADER_LIST_SIZE, lim.max_header_list)
                    + struct.pack(">HI", HEADER_TABLE_SIZE, lim.header_table_size)
                    + struct.pack(">HI", ENABLE_PUSH, 0))
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0,
                                _U32.pack(RECV_CONN_WINDOW - DEFAULT_WINDOW)))

    def data_received(self, data: bytes) -> None:
        self.bytes_read = True  # keepalive hook
        self.buf += data
        if not self.paused:  # else what came before the pause waits with the rest
            self._process()

    def _process(self) -> None:
        """Handle the frames in the buffer, as many as one read may."""
        buf = self.buf
        pos = 0
        self.reading = True
        # this read may open streams up to this id: a peer that skips ids only gets
        # fewer (grpc-core's max_requests_per_read, counted without a counter)
        self.stream_stop = self.last_stream + 2 * self.limits.streams_per_read - 1
        try:
            if not self.preface:
                pos = self._handshake(buf)
                if pos < 0:
                    return
            end = len(buf)
            head = _HEAD.unpack_from
            for _ in range(self.limits.frames_per_read):
                if end - pos < 9:
                    break
                word, flags, sid = head(buf, pos)
                length = word >> 8
                if length > RECV_MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame too large")
                if end - pos - 9 < length:
                    break
                start = pos + 9
                pos = start + length
                self.on_frame(word & 0xFF, flags, sid & 0x7FFFFFFF, buf, start, pos)
            else:
                raise _Enough
            self._consume(pos)
        except _Enough:  # this read's share of work is done: the rest at the next turn
            if len(self._consume(pos)) >= 9:
                self._yield()
        except ConnectionError_ as e:
            self.reading = False
            self._fail(e.code, str(e))
            return
        finally:
            self.reading = False
        if self.recv_unacked >= RECV_CONN_WINDOW >> 1:
            if self.recv_unacked > RECV_CONN_WINDOW:  # more than was ever granted
                return self._fail(FLOW_CONTROL_ERROR, "DATA past the connection window")
            self._ack_connection()
        if self.out:
            self._write_out()

    def _consume(self, pos: int) -> bytearray:
        """Drop the first `pos` bytes of the read buffer (handled); the buffer left."""
        try:
            del self.buf[:pos]
        except BufferError:
            # a view handed to a hook outlived its call (a logged traceback keeps its
            # frames): that buffer stays the view's, the connection goes on in a copy
            self.buf = bytearray(memoryview(self.buf)[pos:])
        return self.buf

    def _handshake(self, buf: bytearray) -> int:
        """Check the client preface and that SETTINGS comes first (RFC 9113 3.4): the
        position after the preface, or -1 while more is needed."""
        if len(buf) < 24:
            if not PREFACE.startswith(bytes(buf)):
                raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
            return -1
        if buf[:24] != PREFACE:
            raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
        if len(buf) < 33:
            return -1
        word, flags, sid = _HEAD.unpack_from(buf, 24)
        if word & 0xFF != SETTINGS or flags & ACK or sid:
            raise ConnectionError_(PROTOCOL_ERROR, "the first frame is not SETTINGS")
        self.preface = True
        return 24

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        if self.paused & PAUSE_BACKLOG:
            self.paused &= ~PAUSE_BACKLOG
            self._yield()  # go on with what is buffered, then read again
        self._wake_writers()

    def connection_lost(self, exc) -> None:
        self.lost = True
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        for st in streams.values():
            self._drop_pending(st)
            self._wake(st)
            self.stream_reset(st)
        self.budget.held -= self.held  # whatever is left: nothing outlives the connection
        self.held = 0
        if self.held_peak >= HEAP_TRIM_HELD and self.loop is not None:
            # the replies it held were freed into the heap, which keeps up to 256 MiB
            # for reuse (keep_freed_heap): a window-starving peer's share goes back now
            self.loop.call_soon(release_freed_heap)
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

    def header_list_too_large(self, stream: Stream, error: HeaderListTooLarge) -> None:
        """The request's headers decoded past the cap: answer the stream (open and
        registered; `error` says by how much). HTTP's answer is 431."""
        self.send_trailers(stream, _STATUS_431)

    # -- frames in --------------------------------------------------------------------

    def on_frame(self, kind: int, flags: int, sid: int, buf: bytearray, start: int,
                 end: int) -> None:
        if self.continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, sid, buf, start, end)
        elif kind == HEADERS:
            self._on_headers(flags, sid, buf, start, end)
            if self.last_stream >= self.stream_stop:
                raise _Enough  # this read opens no more streams
        elif kind == CONTINUATION:
            self._on_continuation(flags, sid, buf, start, end)
        elif kind == SETTINGS:
            self._on_settings_frame(flags, sid, buf, start, end)
        elif kind == WINDOW_UPDATE:
            if end - start != 4:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
            self._on_window_update(sid, _U32.unpack_from(buf, start)[0] & 0x7FFFFFFF)
        elif kind == PING:
            self._on_ping(flags, sid, buf, start, end)
        elif kind == RST_STREAM:
            self._on_rst_stream(sid, buf, start, end)
        elif kind == PRIORITY_FRAME:
            self._on_priority(sid, buf, start, end)
        elif kind == GOAWAY:
            if sid:
                raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
            if end - start < 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad GOAWAY")
            self._going_away()
            if not self.streams:
                self.transport.close()
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:  # unknown frame types are ignored (RFC 9113 5.5), within reason
            self._glitch("unknown frame types")

    def _on_data(self, flags: int, sid: int, buf, start: int, end: int) -> None:
        length = end - start
        self.recv_unacked += length  # padding counts against flow control too
        st = self.streams.get(sid)
        if st is None or st.remote_closed:
            return self._data_elsewhere(sid, st)
        if flags & PADDED:
            if not length:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad padding")
            pad = buf[start]
            start += 1
            end -= pad
            if end < start:
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
        if st.expect is not None:
            st.expect -= end - start
            if st.expect < 0 or (flags & END_STREAM and st.expect):
                return self._peer_reset(st, PROTOCOL_ERROR)  # content-length lied
        if end > start:
            self.stream_data(st, memoryview(buf)[start:end])
        elif not flags & END_STREAM:
            self._glitch("empty DATA frames")
        if flags & END_STREAM:
            st.remote_closed = True
            self.stream_ended(st)
            self._maybe_forget(st)
        else:
            st.recv_unacked += length
            if st.recv_unacked < RECV_STREAM_WINDOW >> 1:
                return
            if st.recv_unacked > RECV_STREAM_WINDOW:  # more than was ever granted
                return self._peer_reset(st, FLOW_CONTROL_ERROR)
            self._ack_stream(st)

    # -- receive windows: given back on arrival, or as the layer above reads -------------
    # Held bytes (a streaming call's messages queued for a handler that has not read
    # them) keep their window shut until released: a peer cannot queue more than its
    # windows' worth of them, a stream's 16 MiB and a connection's 64 MiB in all (Go's
    # x/net/http2 gives windows back as the handler reads, at both levels, for the same
    # reason). Bytes not yet a whole message are never held, so a message larger than
    # the window still arrives. A stream's update goes out once half its window can be
    # given back; the connection's once half its window is unacknowledged, for what is
    # not held, so streams that are not read slow the others down only once they hold
    # the whole connection window.

    def _ack_connection(self) -> None:
        ackable = self.recv_unacked - self.recv_held
        if ackable > 0:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(ackable)))
            self.recv_unacked -= ackable
            self.data_sent = True  # keepalive hook (grpc-core resets its ping clock)

    def _ack_stream(self, st: Stream) -> None:
        ackable = st.recv_unacked - st.recv_held
        if ackable >= RECV_STREAM_WINDOW >> 1:
            self.out.append(frame(WINDOW_UPDATE, 0, st.id, _U32.pack(ackable)))
            st.recv_unacked -= ackable

    def hold(self, st: Stream, n: int) -> None:
        """`n` bytes received on `st` stay the layer above's until `release`: their
        window is not given back before."""
        st.recv_held += n
        self.recv_held += n

    def release(self, st: Stream, n: int) -> None:
        """The layer above is done with `n` held bytes of `st` (read them, or dropped
        them with the stream): their window goes back once it is worth a frame."""
        st.recv_held -= n
        self.recv_held -= n
        if self.transport is None or self.lost:
            return
        if self.recv_unacked >= RECV_CONN_WINDOW >> 1:
            self._ack_connection()
        if not st.remote_closed and st.id in self.streams:
            self._ack_stream(st)
        if self.out:
            self._schedule_flush()

    def _data_elsewhere(self, sid: int, st: Stream | None) -> None:
        """DATA on a stream that is not open for it (its window was counted)."""
        if sid == 0 or sid > self.last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
        if st is not None:  # half-closed (remote): RFC 9113 5.1
            return self._peer_reset(st, STREAM_CLOSED)
        if sid not in self.reset_sent:  # we reset it: ignored, as RFC 9113 5.1 says
            self._glitch("frames on closed streams")
            self.out.append(frame(RST_STREAM, 0, sid, _U32.pack(STREAM_CLOSED)))

    def _on_headers(self, flags: int, sid: int, buf, start: int, end: int) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        pos = start
        if flags & PADDED:
            if end == start:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad padding")
            end -= buf[start]
            pos += 1
        if flags & PRIORITY:
            if end - pos < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR if not flags & PADDED
                                       else PROTOCOL_ERROR, "bad HEADERS priority")
            if _U32.unpack_from(buf, pos)[0] & 0x7FFFFFFF == sid:
                flags |= _SELF_DEPENDENT
            pos += 5
        if end < pos:
            raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
        block = bytes(buf[pos:end])
        st = self.streams.get(sid)
        if st is not None:  # trailers
            what = TRAILERS
            if st.remote_closed:
                what = STREAM_CLOSED  # half-closed (remote): RFC 9113 5.1
            elif not flags & END_STREAM:
                what = PROTOCOL_ERROR  # trailers must end the stream (8.1)
        elif sid <= self.last_stream:
            if sid not in self.reset_sent:
                raise ConnectionError_(STREAM_CLOSED if sid & 1 else PROTOCOL_ERROR,
                                       "HEADERS on a closed stream")
            what = IGNORE  # sent before our RST_STREAM reached the peer
        elif not sid & 1:
            raise ConnectionError_(PROTOCOL_ERROR, "even stream id")
        else:
            self.last_stream = sid
            if len(self.streams) >= self.stream_cap or self.held and self._holding():
                what = REFUSE
            else:
                what = OPEN
                st = Stream(sid, self.peer_initial_window)
        if flags & _SELF_DEPENDENT:
            what = PROTOCOL_ERROR  # a stream cannot depend on itself (5.3.1)
        if not flags & END_HEADERS:
            if len(block) > self.limits.max_header_block:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
            self.continuing = (sid, st, flags & END_STREAM, what, bytearray(block), 0)
            self.continuing_since = self.loop.time()
            return
        self._headers_done(sid, st, flags & END_STREAM, what, block)

    def _on_continuation(self, flags: int, sid: int, buf, start: int, end: int) -> None:
        if self.continuing is None or sid != self.continuing[0]:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        sid, st, end_stream, what, block, count = self.continuing
        block += buf[start:end]
        if len(block) > self.limits.max_header_block:  # a flood: memory, not headers
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if count >= self.limits.max_continuations:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if flags & END_HEADERS:
            self.continuing = None
            self._headers_done(sid, st, end_stream, what, bytes(block))
        else:
            self.continuing = (sid, st, end_stream, what, block, count + 1)

    def _headers_done(self, sid: int, st: Stream | None, end_stream: int, what,
                      block: bytes) -> None:
        """A whole header block: decode it (the dynamic table must follow every block),
        then do what it came for."""
        try:
            headers, problem, length = self.decoder.decode(block)
        except CompressionError as e:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {e}") from None
        except HeaderListTooLarge as e:
            return self._too_large(sid, st, end_stream, what, e)
        if what is OPEN:
            if problem is not None or end_stream and length:
                log.debug("stream %d: malformed request: %s", sid,
                          problem or "content-length and no body")
                return self._refuse(sid, PROTOCOL_ERROR, True)
            self.streams[sid] = st
            st.expect = length
            if end_stream:
                st.remote_closed = True
            self.stream_opened(st, headers, bool(end_stream))
            if end_stream and sid in self.streams:
                self.stream_ended(st)
                self._maybe_forget(st)
        elif what is TRAILERS:
            if trailer_problem(headers) is not None or st.expect:
                return self._peer_reset(st, PROTOCOL_ERROR)
            st.remote_closed = True
            self.stream_ended(st)
            self._maybe_forget(st)
        elif what is REFUSE:
            self._refuse(sid, REFUSED_STREAM, False)
            if not self.going_away:  # no stream slot, or too much held for its windows
                held = self.held and self._holding()
                self._calm_unless(self.resets,
                                  self.limits.held_refusal_cost if held else 1,
                                  "streams refused" + (" while windows stay shut"
                                                       if held else ""))
        elif what is not IGNORE:  # a stream error's code
            if st is not None and sid in self.streams:
                self._peer_reset(st, what)
            else:
                self._refuse(sid, what, True)

    def _too_large(self, sid: int, st: Stream | None, end_stream: int, what,
                   error: HeaderListTooLarge) -> None:
        """A header list past the cap, the table kept right: the stream is answered,
        and the peer pays a reset token per cap's worth (a flagrant amplification
        empties the bucket at once)."""
        log.debug("stream %d: %s", sid, error)
        self._calm_unless(self.resets, error.size // error.limit,
                          f"header lists past {error.limit} bytes")
        if what is OPEN:
            self.streams[sid] = st
            st.remote_closed = bool(end_stream)
            self.header_list_too_large(st, error)
        elif st is not None and sid in self.streams:  # trailers, or a stream error
            self._peer_reset(st, ENHANCE_YOUR_CALM if what is TRAILERS else what)
        elif what is not IGNORE:
            self._refuse(sid, REFUSED_STREAM if what is REFUSE else what, False)

    def _on_settings_frame(self, flags: int, sid: int, buf, start: int, end: int):
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if end != start:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if (end - start) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad SETTINGS")
        if end - start > 6 * self.limits.max_settings:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many settings")
        if self.settled:
            self._glitch("SETTINGS frames")
        self.settled = True
        grew = self._on_settings(bytes(buf[start:end]))
        # the ACK goes before any DATA the new values allow: a peer that raised its
        # window counts on it only once acknowledged (grpc-core resets the stream:
        # "frame of size 5 overflows local window of 0")
        self.out.append(frame(SETTINGS, ACK, 0))
        if grew:
            self._pump_blocked()

    def _on_settings(self, payload: bytes) -> bool:
        """Apply a peer's SETTINGS; True when a stream window grew (blocked data may
        go, after the ACK)."""
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
                    if st.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "window overflow")
                grew = grew or delta > 0
            elif key == MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == ENABLE_PUSH:
                if value > 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad ENABLE_PUSH")
            # HEADER_TABLE_SIZE: our encoder never indexes, nothing to resize; the
            # others (and unknown ones, RFC 9113 6.5.2) do not concern a server
        return grew

    def _on_window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if not increment:
                raise ConnectionError_(PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "window overflow")
            if self.blocked:
                self._pump_blocked()
            return
        st = self.streams.get(sid)
        if st is None:
            if sid > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a client's update for a stream that just finished: common
        if not increment:
            return self._peer_reset(st, PROTOCOL_ERROR)
        st.send_window += increment
        if st.send_window > MAX_WINDOW:
            return self._peer_reset(st, FLOW_CONTROL_ERROR)
        if st.pending or st.trailers is not None:
            self._pump(st)
            self._schedule_flush()

    def _on_ping(self, flags: int, sid: int, buf, start: int, end: int) -> None:
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
        if end - start != 8:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad PING")
        if not flags & ACK:
            # keepalive hook: PINGs too often -> GOAWAY, as grpc-core words it
            if self.policy is not None and self.policy.ping_received():
                raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")
            self._glitch("PING frames")
            self.out.append(frame(PING, ACK, 0, bytes(buf[start:end])))
        elif self.policy is None or not self.policy.ping_acked(bytes(buf[start:end])):
            self._glitch("PING frames")  # keepalive hook: an ACK of ours is no glitch

    def _on_rst_stream(self, sid: int, buf, start: int, end: int) -> None:
        if end - start != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad RST_STREAM")
        if sid == 0 or sid > self.last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        st = self.streams.pop(sid, None)
        if st is None:
            return  # closed already: nothing to do
        self.blocked.pop(sid, None)
        self._drop_pending(st)
        st.local_closed = st.remote_closed = True
        self._wake(st)
        self.stream_reset(st)
        # reset before its response was complete: rapid reset's currency
        self._calm_unless(self.resets, 1, "streams reset")

    def _on_priority(self, sid: int, buf, start: int, end: int) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._glitch("PRIORITY frames")
        code = None
        if end - start != 5:
            code = FRAME_SIZE_ERROR  # a stream error (RFC 9113 6.3)
        elif _U32.unpack_from(buf, start)[0] & 0x7FFFFFFF == sid:
            code = PROTOCOL_ERROR  # a stream cannot depend on itself (5.3.1)
        if code is not None:
            st = self.streams.get(sid)
            if st is not None:
                self._peer_reset(st, code)
            elif sid > self.last_stream:  # no RST_STREAM on an idle stream (6.4)
                raise ConnectionError_(code, "bad PRIORITY")
            else:
                self._refuse(sid, code, True)

    # -- limits -----------------------------------------------------------------------

    def _calm_unless(self, bucket: TokenBucket, n: float, what: str) -> None:
        """Spend `n` tokens; none left: the connection ends with ENHANCE_YOUR_CALM."""
        if self.completed and bucket is self.resets:
            bucket.tokens = min(bucket.burst, bucket.tokens + self.completed)
            self.completed = 0
        if not bucket.take(self.loop.time(), n):
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"too many {what}")

    def _glitch(self, what: str) -> None:
        """A frame that did nothing useful (nghttp2's "glitch")."""
        self._calm_unless(self.glitches, 1, what)

    def _holding(self) -> bool:
        """Whether this connection holds too much for closed windows to take a stream:
        past its own bound, or past the process's while holding anything at all."""
        return self.held >= self.limits.conn_held_max or self.budget.over()

    def _yield(self) -> None:
        """Stop reading; go on with the buffer at the loop's next turn."""
        self._pause(PAUSE_BURST)
        self.loop.call_soon(self._continue)

    def _continue(self) -> None:
        self.paused &= ~PAUSE_BURST
        if self.paused or self.transport is None or self.transport.is_closing():
            return
        self._process()
        if not self.paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def _pause(self, reason: int) -> None:
        if not self.paused:
            self.transport.pause_reading()
        self.paused |= reason

    def _output_backlogged(self) -> None:
        """The transport holds our output: past the high-water mark, stop reading what
        would only add to it until the transport drains (resume_writing)."""
        if self.paused & PAUSE_BACKLOG:
            return
        size = self.transport.get_write_buffer_size()
        if size > self.limits.read_pause_high:
            self._pause(PAUSE_BACKLOG)
            self.stuck_mark, self.stuck_since = size, self.loop.time()

    def tick(self, now: float) -> None:
        """The time limits; the server calls this about once a second."""
        if self.transport is None or self.transport.is_closing():
            return
        lim = self.limits
        if not self.settled:
            if now - self.born > lim.handshake_timeout:
                self._fail(SETTINGS_TIMEOUT, "no connection preface and SETTINGS in time")
            return
        if self.continuing is not None and \
                now - self.continuing_since > lim.header_block_timeout:
            return self._fail(ENHANCE_YOUR_CALM, "header block not completed in time")
        if self.paused & PAUSE_BACKLOG:
            size = self.transport.get_write_buffer_size()
            if size < self.stuck_mark:  # draining: slowly is still progress
                self.stuck_mark, self.stuck_since = size, now
            elif now - self.stuck_since > lim.output_stall:
                log.debug("HTTP/2 peer reads nothing: %d bytes unsent", size)
                return self.transport.abort()
        if self.held >= lim.conn_held_max:
            if not self.held_since or self.held < self.held_mark:
                self.held_mark, self.held_since = self.held, now
            elif now - self.held_since > lim.held_stall:
                return self._fail(ENHANCE_YOUR_CALM, "windows left closed")
        else:
            self.held_since = 0.0
        if self.streams or self.lingering or self.last_stream != self.idle_mark:
            self.idle_mark, self.idle_since = self.last_stream, now
        elif now - self.idle_since > lim.idle_timeout:
            self.goaway()

    # -- frames out -------------------------------------------------------------------

    def _reset(self, st: Stream, code: int) -> None:
        self.out.append(frame(RST_STREAM, 0, st.id, _U32.pack(code)))
        self._remember_reset(st.id)
        self.streams.pop(st.id, None)
        self.blocked.pop(st.id, None)
        self._drop_pending(st)
        st.local_closed = st.remote_closed = True
        self._wake(st)
        self.stream_reset(st)
        self._schedule_flush()

    def _peer_reset(self, st: Stream, code: int) -> None:
        """A stream error the peer caused: reset, and a reset token spent."""
        self._reset(st, code)
        self._calm_unless(self.resets, 1, "streams reset for errors")

    def _refuse(self, sid: int, code: int, count: bool) -> None:
        """A stream never opened: RST_STREAM (its frames to come are ignored)."""
        self.out.append(frame(RST_STREAM, 0, sid, _U32.pack(code)))
        self._remember_reset(sid)
        self._schedule_flush()
        if count:
            self._calm_unless(self.resets, 1, "streams refused")

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

    # -- stopping ---------------------------------------------------------------------

    def _fail(self, code: int, why: str) -> None:
        """A connection error: GOAWAY with `code`, then close; aborted after the
        grace if the peer does not take its output, so nothing it holds stays."""
        if self.transport is None or self.transport.is_closing():
            return
        log.debug("HTTP/2 connection error %d: %s", code, why)
        self._going_away()
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, code)
                              + why.encode()))
        self._write_out()
        self.transport.close()
        self.loop.call_later(self.limits.close_grace, self._abort_if_open)

    def _abort_if_open(self) -> None:
        if not self.lost and self.transport is not None:
            self.transport.abort()

    def goaway(self) -> None:
        """Graceful stop: no new streams; close once the running ones are done."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.going_away:
            self._going_away()
            self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream,
                                                             NO_ERROR)))
        self._write_out()
        if not self.streams:
            self.transport.close()

    def _going_away(self) -> None:
        """GOAWAY sent or received: no new streams."""
        self.going_away = True
        self.stream_cap = 0

    def linger(self, n: int) -> None:
        """`n` more (or fewer) handlers run on after their stream was reset: they hold
        slots of MAX_CONCURRENT_STREAMS until they end (Go's rule)."""
        self.lingering += n
        if not self.going_away:
            self.stream_cap = self.limits.max_streams - self.lingering

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
