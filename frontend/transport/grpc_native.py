"""gRPC over h2.py, without grpcio's transport (`--grpc-frontend native`).

It serves the same `grpc.RpcMethodHandler` table as the grpc.aio server
(grpc_server.handler_table): each handler's request_deserializer,
response_serializer and behaviour are called as grpc.aio would, with a `Context`
offering what the handlers use (abort, invocation_metadata, write, cancelled, done,
peer, time_remaining). gRPC's wire rules (PROTOCOL-HTTP2.md): POST with
content-type application/grpc, 5-byte length-prefixed messages, grpc-encoding
gzip/deflate requests decompressed (replies are identity), grpc-timeout deadlines,
grpc-status and percent-encoded grpc-message in trailers (trailers-only for an
error before any message). Where grpcio strays from the spec, this follows grpcio:
a non-POST request is reset (INTERNAL_ERROR), any content-type is served, and an
unknown grpc-encoding is INTERNAL "Error parsing 'grpc-encoding' metadata".

A unary call costs one asyncio Task (the handler is a coroutine that awaits the
scheduler), except where its method has a starter (`starters`: ModelInfer), which
starts it from the read of its message and answers it from a callback, with no task;
a reply (HEADERS, DATA, trailers) is queued in one go and written with whatever else
finished in the same loop turn.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import struct
import zlib
from collections import deque

import grpc

from .. import inflate
from ..grpc_tls import HANDSHAKE_TIMEOUT
from ..restricted import Restrictions, grpc_refusal
from ..types import BODY_IN_ARENA_MIN
from . import h2
from .h2_keepalive import ConnectionPolicy, KeepaliveSettings
from .h2_limits import DEFAULT_LIMITS, PROCESS_BUDGET, HeldBudget, Limits

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 2**31 - 1  # Triton's limit, both ways
_PREFIX = struct.Struct(">BI")
# a reply up to this size is copied once behind its prefix and sent in one piece with
# its headers and trailers (GrpcConnection.answer); a larger one goes out as views
_WHOLE_MAX = 65536
# An uncompressed unary message of at least BODY_IN_ARENA_MIN bytes, to a method that
# takes it so (ModelInfer), is received straight into the core's shared-memory arena
# if it is at most this large: a bigger one would need a segment of its own, made (and
# prefaulted) on the word of a 5-byte prefix before its bytes arrive; it is gathered in
# process memory as it comes, and its tensors copied into the arena once it is whole
ARENA_BODY_MAX = 64 << 20
_STATUS_CODE = {code: code.value[0] for code in grpc.StatusCode}

# :status 200 (static index 8), content-type (static name 31) application/grpc
STATUS_HEADERS = b"\x88" + b"\x0f\x10" + h2.hpack_int(16, 7) + b"application/grpc"
RESPONSE_HEADERS = STATUS_HEADERS + h2.literal(b"grpc-accept-encoding",
                                               b"identity, deflate, gzip")
OK_TRAILERS = h2.literal(b"grpc-status", b"0")
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3,
                  ord("u"): 1e-6, ord("n"): 1e-9}


def percent_encode(message: str) -> bytes:
    """grpc-message's encoding: UTF-8, bytes outside 0x20-0x7E and '%' as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in raw)


def status_block(code: int, message: str = "") -> bytes:
    block = h2.literal(b"grpc-status", str(code).encode())
    if message:
        block += h2.literal(b"grpc-message", percent_encode(message))
    return block


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout ("1S", "200m", at most 8 digits) in seconds; None if malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


class Abort(Exception):
    """Raised by Context.abort: ends the RPC with this status."""

    def __init__(self, code: int, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class RequestStream:
    """The request iterator of a client-streaming call. The messages it queues hold
    their flow-control window (H2Connection.hold) until the handler takes them, so a
    handler that stops reading stops the client sending, and what waits here is
    bounded by the windows."""

    __slots__ = ("loop", "items", "sizes", "waiter", "ended", "conn", "stream")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn=None, stream=None):
        # the connection's loop: asyncio.get_running_loop() asks the kernel for the
        # pid (getpid()) on every call in Python 3.11, once per message here
        self.loop = loop
        self.items: deque = deque()
        self.sizes: deque = deque()  # the wire bytes each item holds of the windows
        self.waiter: asyncio.Future | None = None
        self.ended = False
        self.conn, self.stream = conn, stream  # who gets the window back (None: nobody)

    def put(self, item, nbytes: int = 0) -> None:
        self.items.append(item)
        self.sizes.append(nbytes)
        if nbytes and self.conn is not None:
            self.conn.hold(self.stream, nbytes)
        self._wake()

    def release_all(self) -> None:
        """The call ended: the window of what is still queued goes back now, and
        nothing taken later is counted again."""
        conn, self.conn = self.conn, None
        if conn is not None:
            held = sum(self.sizes)
            if held:
                conn.release(self.stream, held)

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self.items:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = self.loop.create_future()
            await self.waiter
        item = self.items.popleft()
        nbytes = self.sizes.popleft()
        if nbytes and self.conn is not None:
            self.conn.release(self.stream, nbytes)
        if isinstance(item, Abort):
            raise item
        if type(item) is Inflating:
            return await item.message()
        return item


class Inflating:
    """A compressed request message, inflated when the handler's task takes it: a
    step at a time (frontend/inflate.py), capped at the largest message the server
    receives, as grpc-go and grpc-java cap it (grpc-core caps only the compressed
    size: a few KiB of gzip could make GiBs)."""

    __slots__ = ("conn", "call", "data")

    def __init__(self, conn: "GrpcConnection", call: Call, data):
        self.conn, self.call, self.data = conn, call, data

    async def message(self):
        call, server = self.call, self.conn.server
        limit = server.max_message
        data, self.data = self.data, None
        try:
            data = await inflate.inflate_async(data, call.encoding.decode(), limit,
                                               http=False,
                                               check=server.message_checks.get(call.path))
        except inflate.TooLarge:
            raise Abort(8, "grpc: received message after decompression larger than "
                           "max %d" % limit) from None
        except zlib.error as e:
            raise Abort(13, f"Failed to decompress the message: {e}") from None
        return self.conn._deserialize(call, data)


class Call:
    """One RPC: its stream, handler, metadata and the Context handlers get."""

    __slots__ = ("conn", "stream", "handler", "path", "raw_metadata", "metadata",
                 "encoding", "body", "requests", "task", "pending", "timer", "deadline",
                 "finished", "deadline_hit", "reset", "block", "block_view", "filled")

    def __init__(self, conn, stream, handler, path, raw_metadata, encoding):
        self.conn = conn
        self.stream = stream
        self.handler = handler
        self.path = path
        self.raw_metadata = raw_metadata
        self.metadata = None
        self.encoding = encoding
        self.body = bytearray()
        self.requests: RequestStream | None = None
        self.task: asyncio.Task | None = None
        # a call started without a task (NativeGrpcServer.starters): what it is
        # waiting on, whose cancel() drops it (the client reset it, its deadline passed)
        self.pending = None
        self.timer = None
        self.deadline: float | None = None
        self.finished = False
        self.deadline_hit = False
        self.reset = False  # the client cancelled (RST_STREAM) or went away
        # a large unary message received into an arena block: the block, a view of
        # it and how much of it has arrived; the call frees the block unless the
        # handler takes it (take_body_block), whose request then frees it
        self.block = self.block_view = None
        self.filled = 0

    def take_body_block(self):
        """The arena block the message was received into (None when it was not): from
        now on the caller frees it."""
        block, self.block = self.block, None
        return block

    # -- the grpc.aio ServicerContext subset the handlers use --------------------------

    async def abort(self, code, details: str = "", trailing_metadata=()):
        raise Abort(_STATUS_CODE.get(code, 2), details)

    def invocation_metadata(self):
        if self.metadata is None:
            md = []
            for key, value in self.raw_metadata:
                k = key.decode("latin-1")
                if k.endswith("-bin"):
                    md.append((k, base64.b64decode(value + b"=" * (-len(value) % 4))))
                else:
                    md.append((k, value.decode("latin-1")))
            self.metadata = tuple(md)
        return self.metadata

    async def write(self, message) -> None:
        if self.finished:
            raise asyncio.CancelledError()
        ser = self.handler.response_serializer
        if ser is not None:
            message = ser(message)
        self.conn.send_message(self, message)
        room = self.conn.room(self.stream)
        if room is not None:
            await room

    def cancelled(self) -> bool:
        return self.reset or self.deadline_hit

    def done(self) -> bool:
        return self.finished

    def peer(self) -> str:
        peer = self.conn.transport.get_extra_info("peername") if self.conn.transport \
            else None
        if not peer:
            return "unknown"
        host, port = peer[0], peer[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.conn.loop.time())

    def set_code(self, code) -> None:  # grpc.aio offers these; no handler relies on them
        pass

    def set_details(self, details) -> None:
        pass


class GrpcConnection(h2.H2Connection):
    """One client connection of the native gRPC server."""

    __slots__ = ("server", "handlers", "restrictions", "arena_paths", "quota",
                 "seen_headers", "seen_call")

    def __init__(self, server: "NativeGrpcServer"):
        super().__init__(server.limits, server.budget)
        self.server = server
        # the last request headers read, and what stream_opened made of them: the
        # decoder gives the same tuple for the same block, as a client's calls send
        self.seen_headers = self.seen_call = None
        self.handlers = server.handlers
        self.restrictions = server.restrictions
        self.arena_paths = server.arena_paths if server.body_buffer is not None else ()
        # this connection's share of the arena for messages received into it
        self.quota = server.body_quota() if server.body_quota is not None else None

    def connection_made(self, transport):
        super().connection_made(transport)
        if len(self.server.connections) >= self.limits.max_connections:
            # accepted to say why: a client sees UNAVAILABLE and backs off
            return self._fail(h2.ENHANCE_YOUR_CALM, "too many connections")
        self.server.connections.add(self)
        if self.server.keepalive is not None:
            self.policy = ConnectionPolicy(self.server.keepalive, self)

    def connection_closed(self) -> None:
        self.server.connections.discard(self)

    def header_list_too_large(self, stream, error) -> None:
        # grpc-core's answer, in its words: RESOURCE_EXHAUSTED, trailers only
        call = Call(self, stream, None, "", (), None)
        stream.app = call
        self.finish(call, 8, str(error))

    # -- requests in ------------------------------------------------------------------

    def stream_opened(self, stream, headers, end_stream) -> None:
        if headers is self.seen_headers:
            method, path_s, handler, encoding, seconds, metadata = self.seen_call
        else:
            method, path_s, handler, encoding, seconds, metadata = self.seen_call = \
                self._call_headers(headers)
            self.seen_headers = headers
        if method != b"POST":  # as grpcio: the stream is reset (INTERNAL_ERROR)
            return self._reset(stream, h2.INTERNAL_ERROR)
        call = Call(self, stream, handler, path_s, metadata, encoding)
        stream.app = call
        if handler is None:
            return self.finish(call, 12, "Method not found!")
        if encoding not in (None, b"identity", b"gzip", b"deflate"):
            # grpcio's answer on the wire (the spec says UNIMPLEMENTED)
            return self.finish(call, 13, "Error parsing 'grpc-encoding' metadata")
        if self.restrictions:
            refusal = grpc_refusal(path_s, call.invocation_metadata(), self.restrictions)
            if refusal is not None:
                return self.finish(call, 14, refusal)
        if seconds is not None:
            call.deadline = self.loop.time() + seconds
            call.timer = self.loop.call_at(call.deadline, self._deadline, call)
        if handler.request_streaming:
            call.requests = RequestStream(self.loop, self, stream)
            self._start(call, call.requests)

    def _call_headers(self, headers) -> tuple:
        """(method, path, its handler or None, grpc-encoding, grpc-timeout in seconds
        (None: none, or malformed), the metadata) of a request's headers."""
        path = method = encoding = timeout = None
        metadata = []
        for name, value in headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            # content-type is not checked: grpcio serves any (the spec's 415 is a SHOULD)
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-timeout":
                timeout = value
            elif (name != b"te" and name != b"content-type"
                  and not name.startswith(b"grpc-")):
                metadata.append((name, value))
        path_s = path.decode("latin-1") if path else ""
        return (method, path_s, self.handlers.get(path_s), encoding,
                None if timeout is None else parse_timeout(timeout), tuple(metadata))

    def stream_data(self, stream, data) -> None:
        call = stream.app
        if call is None or call.finished:
            return
        view = call.block_view
        if view is not None:
            pos = call.filled
            end = pos + len(data)
            if end > len(view):
                return self.finish(call, 13, "Received more than one request message")
            view[pos:end] = data  # the one copy of the message: into shared memory
            call.filled = end
            return
        body = call.body
        body += data
        if len(body) >= 5:
            flag, n = _PREFIX.unpack_from(body)
            if n > MAX_MESSAGE_BYTES:
                return self.finish(call, 8, "Received message larger than max (%d vs. %d)"
                                   % (n, MAX_MESSAGE_BYTES))
            if call.requests is not None:
                self._take_messages(call)
            elif (BODY_IN_ARENA_MIN <= n <= self.server.arena_body_max and not flag
                  and call.path in self.arena_paths
                  and len(body) <= n + 5):
                self._into_arena(call, n + 5)

    def _into_arena(self, call: Call, size: int) -> None:
        """Go on receiving the message in an arena block (what came so far copied)."""
        try:
            got = self.server.body_buffer(size, self.quota)
        except Exception:  # no room: the message stays in process memory
            log.warning("no arena block of %d bytes for a gRPC message", size,
                        exc_info=True)
            return
        if got is None:
            # past this connection's or the process's budget for arena bodies: the
            # message grows in process memory as it arrives (asked again as it does)
            return
        view, block = got
        body = call.body
        view[:len(body)] = body
        call.block, call.block_view, call.filled = block, view, len(body)
        call.body = bytearray()

    def _free_block(self, call: Call) -> None:
        block = call.take_body_block()
        call.block_view = None
        if block is not None:
            self.server.free_blocks((block,))

    def stream_ended(self, stream) -> None:
        call = stream.app
        if call is None or call.finished:
            return
        if call.requests is not None:
            self._take_messages(call)
            call.requests.end()
            return
        # a unary request: exactly one message
        view = call.block_view
        if view is not None:
            if call.filled < len(view):
                return self.finish(call, 13, "Incomplete request message")
            call.block_view = None
            try:
                # the handler takes the block with the message (take_body_block), or
                # finish() frees it
                message = self._message(call, 0, view[5:])
            except Abort as e:
                return self.finish(call, e.code, e.details)
            call.body = None
            return self._start(call, message)
        body = call.body
        if len(body) < 5:
            return self.finish(call, 13, "Received no request message" if not body
                               else "Incomplete request message")
        flag, n = _PREFIX.unpack_from(body)
        if len(body) != n + 5:
            return self.finish(call, 13, "Incomplete request message"
                               if len(body) < n + 5 else
                               "Received more than one request message")
        try:
            # a view, not a copy: the buffer is the message's alone from here on (a
            # handler that keeps slices of it, as ModelInfer's decoder does, keeps
            # it alive; nothing writes to it again)
            message = self._message(call, flag, memoryview(body)[5:])
        except Abort as e:
            return self.finish(call, e.code, e.details)
        call.body = None
        self._start(call, message)

    def stream_reset(self, stream) -> None:
        call = stream.app
        if call is None or call.finished:
            return
        call.finished = call.reset = True
        self._free_block(call)  # not taken: the handler has not run and will not
        if call.timer is not None:
            call.timer.cancel()
        if call.requests is not None:
            call.requests.end()
            call.requests.release_all()
        pending = call.pending
        if pending is not None:  # dropped at once: nothing runs on to count (below)
            call.pending = None
            pending.cancel()
        task = call.task
        if task is not None and not task.done():
            task.cancel()
            # until it has ended it counts against MAX_CONCURRENT_STREAMS (Go's rule
            # against rapid reset): resets cannot open unbounded work
            self.linger(1)
            task.add_done_callback(self._handler_ended)

    def _handler_ended(self, task) -> None:
        self.linger(-1)

    def _take_messages(self, call: Call) -> None:
        body, pos, end = call.body, 0, len(call.body)
        view = memoryview(body)
        try:
            while end - pos >= 5:
                flag, n = _PREFIX.unpack_from(body, pos)
                if end - pos - 5 < n:
                    break
                try:
                    call.requests.put(self._message(
                        call, flag, bytes(view[pos + 5:pos + 5 + n])), 5 + n)
                except Abort as e:
                    call.requests.put(e, 5 + n)
                pos += 5 + n
        finally:
            view.release()
        if pos:
            del body[:pos]

    def _message(self, call: Call, flag: int, data: bytes):
        if flag:
            if call.encoding not in (b"gzip", b"deflate"):
                raise Abort(13, "Compressed message without grpc-encoding")
            # inflated by the task that runs the handler, a step at a time
            return Inflating(self, call, data)
        return self._deserialize(call, data)

    def _deserialize(self, call: Call, data):
        deser = call.handler.request_deserializer
        if deser is not None:
            try:
                return deser(data)
            except Exception as e:
                raise Abort(13, f"Failed to deserialize the request: {e}") from None
        return data

    # -- running handlers -------------------------------------------------------------

    def _start(self, call: Call, request) -> None:
        h = call.handler
        if not (h.response_streaming or h.request_streaming) \
                and type(request) is not Inflating:
            starter = self.server.starters.get(call.path)
            if starter is not None:
                return self._start_untasked(call, starter, request)
        if h.response_streaming:
            behavior = h.stream_stream if h.request_streaming else h.unary_stream
            coro = self._run_streaming(call, behavior, request)
        else:
            behavior = h.stream_unary if h.request_streaming else h.unary_unary
            coro = self._run_unary(call, behavior, request)
        call.task = self.loop.create_task(coro)

    def _start_untasked(self, call: Call, starter, request) -> None:
        """A unary call whose method has a starter: no task, the reply from a
        callback (`_replied`), as _run_unary would have sent it."""
        try:
            pending = starter(request, call,
                              lambda reply, status=None: self._replied(call, reply, status))
        except Exception as e:  # noqa: BLE001 - a bug in the starter: answered
            return self._failed(call, e)
        if not call.finished:
            call.pending = pending

    def _replied(self, call: Call, reply, status=None) -> None:
        """A starter's answer: the reply message, or status (grpc.StatusCode, details)."""
        call.pending = None
        if call.finished:
            return  # reset, or past its deadline: answered already
        if status is not None:
            code, details = status
            return self.finish(call, _STATUS_CODE.get(code, 2), details)
        try:
            self.answer(call, reply)
        except Abort as e:
            self.finish(call, e.code, e.details)

    async def _run_unary(self, call: Call, behavior, request) -> None:
        try:
            if type(request) is Inflating:
                request = await request.message()
            response = await behavior(request, call)
            ser = call.handler.response_serializer
            if ser is not None:
                response = ser(response)
        except (Abort, asyncio.CancelledError, Exception) as e:
            self._failed(call, e)
        else:
            if not call.finished:
                try:
                    self.answer(call, response)
                except Abort as e:
                    self.finish(call, e.code, e.details)

    async def _run_streaming(self, call: Call, behavior, request) -> None:
        try:
            if type(request) is Inflating:
                request = await request.message()
            result = behavior(request, call)
            if inspect.isasyncgen(result):
                async for message in result:
                    await call.write(message)
            else:
                await result
        except (Abort, asyncio.CancelledError, Exception) as e:
            self._failed(call, e)
        else:
            self.finish(call, 0)

    def _failed(self, call: Call, e: BaseException) -> None:
        """End a call whose handler raised: its abort's status, CANCELLED or
        DEADLINE_EXCEEDED for a cancel, UNKNOWN (as grpcio words it) for a bug."""
        if isinstance(e, Abort):
            self.finish(call, e.code, e.details)
        elif isinstance(e, asyncio.CancelledError):
            self._cancelled(call)
        else:
            log.error("gRPC %s failed", call.path, exc_info=e)
            self.finish(call, 2, f"Unexpected {type(e)}: {e}")

    def _cancelled(self, call: Call) -> None:
        if call.deadline_hit or not call.finished:
            self.finish(call, 4 if call.deadline_hit else 1,
                        "Deadline Exceeded" if call.deadline_hit else "Cancelled")

    def _deadline(self, call: Call) -> None:
        call.timer = None
        if call.finished:
            return
        call.deadline_hit = True
        pending, call.pending = call.pending, None
        if pending is not None:  # a call started without a task: dropped, answered below
            pending.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()  # _cancelled answers DEADLINE_EXCEEDED
        else:
            self.finish(call, 4, "Deadline Exceeded")

    # -- replies out ------------------------------------------------------------------

    def send_message(self, call: Call, message) -> None:
        n = len(message)
        self._send_framed(call.stream, n, _PREFIX.pack(0, n) + message
                          if n <= _WHOLE_MAX else None, message)

    def _send_framed(self, stream, n: int, framed, message) -> None:
        """A reply of `n` bytes, `framed` behind its prefix already (a small one), or
        else `message` sent after its prefix without a copy."""
        if not stream.headers_sent:
            self.send_headers(stream, RESPONSE_HEADERS)
        if n > MAX_MESSAGE_BYTES:
            raise Abort(8, "Sent message larger than max (%d vs. %d)"
                        % (n, MAX_MESSAGE_BYTES))
        if framed is not None:
            self.send_data(stream, framed)
        else:  # no copy of a large reply into a new buffer
            self.send_data(stream, _PREFIX.pack(0, n))
            self.send_data(stream, message)

    def answer(self, call: Call, message) -> None:
        """A unary call's reply and OK status. A reply that fits the windows and one
        frame goes out with its headers and trailers as one piece (send_whole), else
        the long way with the same framed bytes; Abort for one past the size limit."""
        n = len(message)
        framed = _PREFIX.pack(0, n) + message if n <= _WHOLE_MAX else None
        if framed is not None and self.send_whole(call.stream, RESPONSE_HEADERS, framed,
                                                  OK_TRAILERS):
            self._ended(call)
            return
        self._send_framed(call.stream, n, framed, message)
        self.finish(call, 0)

    def finish(self, call: Call, code: int, message: str = "") -> None:
        """End the call with this status (trailers, or trailers-only before any reply)."""
        if call.finished:
            return
        self._ended(call)
        stream = call.stream
        if code == 0 and stream.headers_sent:
            self.send_trailers(stream, OK_TRAILERS)
        elif stream.headers_sent:
            self.send_trailers(stream, status_block(code, message))
        else:
            self.send_trailers(stream, STATUS_HEADERS + status_block(code, message))

    def _ended(self, call: Call) -> None:
        """What a call holds, let go: its arena block, its deadline, its request
        stream."""
        call.finished = True
        self._free_block(call)
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.requests is not None:
            call.requests.end()
            call.requests.release_all()


class NativeGrpcServer:
    """A listening socket and its connections; the grpc.aio.Server calls main.py uses
    (start, stop, bound_port). With `ssl_context` (frontend.grpc_tls) the port speaks
    TLS: a handshake not done within `tls_handshake_timeout` seconds is dropped."""

    # keepalive, PING abuse and age policy of every connection (None: none at all)
    keepalive: KeepaliveSettings | None = None
    ssl_context = None
    body_quota = None  # no arena bodies unless given (__init__)

    TICK = 1.0  # seconds between the connections' time-limit checks (H2Connection.tick)

    max_message = MAX_MESSAGE_BYTES  # the largest message, once decompressed
    # path -> check(prefix): whether a message beginning so is malformed whatever
    # follows (a compressed one stops inflating then)
    message_checks: dict = {}
    # path -> start(message, call, done): unary methods answered without a task
    starters: dict = {}

    def __init__(self, handlers: dict, sock, restrictions: Restrictions | None = None,
                 body_buffer=None, free_blocks=None, arena_paths=(),
                 arena_body_max: int = ARENA_BODY_MAX, body_quota=None,
                 max_message: int = MAX_MESSAGE_BYTES, message_checks: dict | None = None,
                 starters: dict | None = None,
                 keepalive: KeepaliveSettings | None = KeepaliveSettings(),
                 ssl_context=None, tls_handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 limits: Limits | None = None, budget: HeldBudget | None = None):
        # the HTTP/2 limits (h2_limits.py) and the bytes this process holds
        # for peers' closed windows, shared by every connection
        self.limits = limits or DEFAULT_LIMITS
        self.budget = budget or PROCESS_BUDGET
        self.ticker: asyncio.Task | None = None
        self.handlers = handlers  # "/service/Method" -> grpc.RpcMethodHandler
        self.restrictions = restrictions or None
        # large unary messages to `arena_paths` are received into blocks that
        # body_buffer(nbytes, quota) -> (view, block) gives (None: past the budget)
        # and free_blocks(blocks) frees, each connection holding the quota that
        # body_quota() makes; the handler takes its block from the call
        # (Call.take_body_block)
        self.body_buffer = body_buffer
        self.body_quota = body_quota
        self.free_blocks = free_blocks
        self.arena_paths = frozenset(arena_paths)
        self.arena_body_max = arena_body_max
        self.max_message = max_message
        self.message_checks = message_checks or {}
        # "/service/Method" -> start(message, call, done) for unary methods served
        # without a task: it starts the call and returns what it waits on (cancel()
        # drops it), or None once answered; done(reply) or done(None, (grpc status,
        # details)) answers, once, from the loop (ModelInfer: grpc_server's)
        self.starters = starters or {}
        self.sock = sock
        self.bound_port = sock.getsockname()[1]
        self.connections: set[GrpcConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.keepalive = keepalive
        self.ssl_context = ssl_context
        self.tls_handshake_timeout = tls_handshake_timeout

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        tls = {}
        if self.ssl_context is not None:  # the protocol sees the connection once it is up
            tls = {"ssl": self.ssl_context,
                   "ssl_handshake_timeout": self.tls_handshake_timeout}
        self.server = await loop.create_server(lambda: GrpcConnection(self),
                                               sock=self.sock, **tls)
        self.ticker = loop.create_task(self._tick())

    async def _tick(self) -> None:
        """The connections' time limits (handshake, header block, idle, stalls)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.TICK)
            now = loop.time()
            for conn in list(self.connections):
                try:
                    conn.tick(now)
                except Exception:  # one connection's trouble must not stop the others'
                    log.exception("HTTP/2 connection tick failed")
                    conn.abort()

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening; GOAWAY to every connection, whose running calls get `grace`
        seconds to finish before they are cancelled and the connections dropped."""
        if self.server is not None:
            self.server.close()
        if self.ticker is not None:
            self.ticker.cancel()
        for conn in list(self.connections):
            conn.goaway()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0)
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)
