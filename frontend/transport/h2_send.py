"""The half of h2.py that writes: `H2Output`, the base of H2Connection, owns
what goes to the peer. Responses (`send_headers`, `send_data`, `send_trailers`) never
block: data beyond what the peer's windows allow waits in its stream and goes out as
WINDOW_UPDATEs arrive, in frames no larger than the peer's MAX_FRAME_SIZE, and writers
ask `room()` before adding more. What is written while a read is handled goes out in
one transport.write; later output is gathered until the loop's next turn.

Bytes waiting for window are "held": counted per connection and in the process's
HeldBudget, so that a peer that never opens its windows holds a bounded amount.

H2Output works on the connection's state: `streams`, `loop`, `transport`, `limits`,
`reading` and `completed`, and calls its `_maybe_forget` and `_output_backlogged`.
"""

from __future__ import annotations

import asyncio

from .h2_frames import (DATA, DEFAULT_WINDOW, END_HEADERS, END_STREAM, HEADERS,
                        CONTINUATION, NO_ERROR, RST_STREAM, STREAM_WRITE_HIGH,
                        WRITELINES_MIN, Stream, _HEAD, _U32, frame)
from .h2_limits import HeldBudget

RESET_MEMORY = 256  # streams we reset, remembered: frames the peer sent on them are ignored


class H2Output(asyncio.Protocol):
    """What an HTTP/2 connection sends, and the flow control toward the peer."""

    # slots: attribute access on the hot path stays specialized however many
    # attributes the connection grows (an instance dict past 30 keys loses CPython
    # 3.11's shared-key fast path: +6% instructions per request when it did)
    __slots__ = ("budget", "send_window", "peer_initial_window", "peer_max_frame",
                 "blocked", "held", "out", "flush_scheduled", "write_paused",
                 "resume_waiters", "reset_sent", "data_sent", "held_peak")

    def __init__(self, budget: HeldBudget):
        self.budget = budget
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.blocked: dict[int, Stream] = {}  # streams with data waiting for window
        self.held = 0  # bytes in all streams' pending: waiting for window
        self.held_peak = 0  # the most it ever was
        self.out: list = []
        self.flush_scheduled = False
        self.write_paused = False
        self.resume_waiters: list[asyncio.Future] = []
        self.reset_sent: dict[int, None] = {}  # the last RESET_MEMORY streams we reset
        # keepalive hook: HEADERS, DATA or a connection WINDOW_UPDATE queued since the
        # policy (h2_keepalive.py) last looked
        self.data_sent = False

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
            self._hold(len(view))
            self._pump(st)
        self._schedule_flush()

    def send_whole(self, st: Stream, headers: bytes, data: bytes,
                   trailers: bytes) -> bool:
        """A whole response at once, in three frames appended as one piece: what
        send_headers, send_data and send_trailers would queue, for a stream that has
        sent nothing yet and a body the windows take now in one frame. False, with
        nothing sent, when that is not so: the caller goes the long way."""
        n = len(data)
        limit = self.peer_max_frame
        if (st.headers_sent or st.pending or st.local_closed or not st.remote_closed
                or not n or n > self.send_window or n > st.send_window or n > limit
                or len(headers) > limit or len(trailers) > limit):
            return False
        self.send_window -= n
        st.send_window -= n
        sid = st.id
        self.out.append(b"".join((
            _HEAD.pack((len(headers) << 8) | HEADERS, END_HEADERS, sid), headers,
            _HEAD.pack((n << 8) | DATA, 0, sid), data,
            _HEAD.pack((len(trailers) << 8) | HEADERS, END_HEADERS | END_STREAM, sid),
            trailers)))
        self.data_sent = True  # keepalive hook
        st.headers_sent = st.local_closed = True
        self.completed += 1  # a response completed: a reset token back (h2o)
        self._maybe_forget(st)
        self._schedule_flush()
        return True

    def send_trailers(self, st: Stream, block: bytes) -> None:
        """End the stream with this header block, after whatever data is queued."""
        if st.local_closed:
            return
        st.trailers = block
        self._pump(st)
        self._schedule_flush()

    def room(self, st: Stream):
        """None when a writer may go on, else a future resolved once it may: the
        stream holds too much, the transport is full, or the connection holds too much
        for closed windows."""
        if st.local_closed or (st.pending_bytes < STREAM_WRITE_HIGH
                               and not self.write_paused
                               and self.held < self.limits.conn_held_max):
            return None
        fut = self.loop.create_future()
        if st.pending_bytes >= STREAM_WRITE_HIGH:
            st.waiter = fut
        else:
            self.resume_waiters.append(fut)
        return fut

    def _pump(self, st: Stream) -> None:
        if st.pending and self._pump_data(st):
            return  # the rest waits for window
        self.blocked.pop(st.id, None)
        if st.waiter is not None:
            self._wake(st)
        if st.trailers is not None:
            block, st.trailers = st.trailers, None
            self._header_frames(st.id, block, END_STREAM)
            st.local_closed = True
            self.completed += 1  # a response completed: a reset token back (h2o)
            if not st.remote_closed:  # the answer is complete: the rest is not wanted
                self.out.append(frame(RST_STREAM, 0, st.id, _U32.pack(NO_ERROR)))
                st.remote_closed = True
                self._remember_reset(st.id)
            self._maybe_forget(st)

    def _pump_data(self, st: Stream) -> bool:
        """Send what the windows allow of the stream's pending data; True if some is
        left (the stream is then blocked)."""
        out = self.out
        sent = 0
        while st.pending:
            n = min(self.send_window, st.send_window, self.peer_max_frame)
            if n <= 0:
                self.blocked[st.id] = st
                break
            chunk = st.pending[0]
            if len(chunk) <= n:
                n = len(chunk)
                st.pending.pop(0)
            else:
                st.pending[0] = chunk[n:]
                chunk = chunk[:n]
            self.send_window -= n
            st.send_window -= n
            sent += n
            out.append(_HEAD.pack((n << 8) | DATA, 0, st.id))
            out.append(chunk)
        if sent:
            self.data_sent = True  # keepalive hook
            st.pending_bytes -= sent
            self._hold(-sent)
            if self.resume_waiters:
                self._wake_writers()
        return bool(st.pending)

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

    def _wake_writers(self) -> None:
        """Writers waiting for the transport or the connection's held bytes go on once
        neither holds them."""
        if self.write_paused or self.held >= self.limits.conn_held_max:
            return
        waiters, self.resume_waiters = self.resume_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _hold(self, n: int) -> None:
        self.held += n
        self.budget.held += n
        if self.held > self.held_peak:
            self.held_peak = self.held

    def _drop_pending(self, st: Stream) -> None:
        if st.pending_bytes:
            self._hold(-st.pending_bytes)
            st.pending.clear()
            st.pending_bytes = 0
            self._wake_writers()

    def _remember_reset(self, sid: int) -> None:
        sent = self.reset_sent
        sent[sid] = None
        if len(sent) > RESET_MEMORY:
            del sent[next(iter(sent))]

    def send_frame(self, data: bytes) -> None:
        """Keepalive hook: queue frames built elsewhere (h2_keepalive.py's
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
        if self.write_paused:
            self._output_backlogged()
