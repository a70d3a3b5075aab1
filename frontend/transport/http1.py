"""HTTP/1.1 on an asyncio Protocol with httptools, without uvicorn (`--http-frontend
native`).

POST /v2/models/<m>[/versions/<v>]/infer is served here: the body is gathered from the
parser's callbacks (straight into the shared-memory arena when large), decoded and
started from the callback that completes it, and answered in one write from the
callback that reads its response (InferEndpoint.prepare/start/answer over the data
plane's start_unary: no task, future or coroutine per request; a body to inflate goes
through InferEndpoint.respond in a task), with no ASGI scope or messages. Every other
request goes to the starlette app (http_server's
_HttpApp) through a minimal ASGI adapter: streamed bodies both ways, `http.disconnect`
when the client goes away or the response is complete, as uvicorn gives them.

HTTP/1.1 as uvicorn serves it: keep-alive (HTTP/1.0 only on request), pipelined
requests answered in order (one at a time per connection), Content-Length and chunked
bodies, `Expect: 100-continue` (answered when the body is first wanted), a malformed
request is a 400 and the connection closes. Past what uvicorn does: the request line
and headers are capped (431), and reading stops while the transport's write buffer is
full (pause_writing) or too many requests wait in the pipeline. A read that repeats
the connection's last infer head with exactly its body skips the parser (_Head).

Deadlines, as nginx sets them (a slow sender holds a connection, not the server): a
request's line and headers must arrive within `header_timeout` of their first byte
(a new connection's first request, of the connection; nginx's client_header_timeout),
a body must not stop for `body_timeout` between two reads (client_body_timeout): past
either, a 408 and a close. A keep-alive connection waiting for a request is closed
after `idle_timeout`. One sweep looks at every connection a few times per timeout, so
a request pays no timer. Past `max_connections` open connections, a new one takes the
place of the longest idle keep-alive one, or is refused with a 503 and closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from .. import http_codec
from ..http_server import InferEndpoint, infer_headers, infer_target
from ..restricted import input_size_message, path_refusal
from ..types import InferResult
from .http1_limits import (BODY_TIMEOUT, HEADER_TIMEOUT, IDLE, IDLE_TIMEOUT, LINGER,
                           MAX_CONNECTIONS, TIMED_OUT, default_max_connections, sweep)

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024  # request line and headers together
MAX_PIPELINE = 16  # requests read ahead of the one being answered
# the longest head a connection remembers (_Head): clients' are a few hundred bytes,
# and a connection's memo must not hold what a hostile one sends (up to 64 KiB)
MEMO_HEAD_MAX = 4096
BODY_HIGH_WATER = 64 * 1024  # bytes an ASGI request buffers before reading pauses

_STATUS_LINE = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JSON = b"application/json"


def _status_line(status: int) -> bytes:
    line = _STATUS_LINE.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def _closing_error(status: int, text: str) -> bytes:
    """A complete response that closes the connection (protocol errors), in the form
    of every other error here: `{"error": ...}`. Triton closes without a word on a
    request its parser refuses; a client is better served by a status and a reason."""
    body = http_codec.encode_error(text)
    return (_status_line(status) + b"content-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)


class _Request:
    """One request: what the parser gave, its body, and where its response stands."""

    __slots__ = ("method", "path", "raw_path", "query", "headers", "version", "keep_alive",
                 "expect", "target", "info", "body", "body_size", "body_done", "arena",
                 "block", "refusal", "task", "waiter", "gone", "watching", "started", "done",
                 "chunked", "head_only", "delivered")

    def __init__(self):
        self.body: list = []
        self.body_size = 0
        self.body_done = False
        self.arena = self.block = self.refusal = None
        self.task = self.waiter = None
        self.gone = self.watching = self.started = self.done = False
        self.chunked = None  # None: no response yet; then whether it is chunked
        self.head_only = self.delivered = False

    # the watch InferEndpoint.respond starts: the connection cancels the task itself
    def watch(self) -> "_Request":
        self.watching = True
        return self

    def stop(self) -> None:
        self.watching = False

    def wake(self) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)


class _Head:
    """A request head the parser read whole, with its body, from one read, and what it
    gave: a client that sends the same head again and again (wrk, perf_analyzer,
    tritonclient with the same inputs: only the body's bytes change) gets its next
    requests taken from it, without the parser's nine callbacks or their checks.

    Only a POST to the infer route with a Content-Length body, kept alive, not refused
    and not waiting for a 100-continue is kept, and it is used only for a read that
    begins where the parser would begin a request, starts with exactly these bytes and
    holds exactly the body they announce and nothing more: the same bytes the parser
    accepted, which it would parse the same way, and no others."""

    __slots__ = ("head", "size", "method", "headers", "query", "raw_path", "path",
                 "target", "version", "info")

    def __init__(self, head: bytes, req: "_Request"):
        self.head = head
        self.size = len(head) + req.info[3]  # the read: head and Content-Length bytes
        self.method = req.method
        self.headers = req.headers  # shared: nothing downstream changes them
        self.query = req.query
        self.raw_path = req.raw_path
        self.path = req.path
        self.target = req.target
        self.version = req.version
        self.info = req.info


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection. `app`: http_server's _HttpApp (its `infer` endpoint,
    `restrictions` and `max_input` serve the fast path)."""

    def __init__(self, app, connections: set, max_connections: int = MAX_CONNECTIONS,
                 lingering: set | None = None):
        self.app = app
        self.max_connections = max_connections
        self.closed_lingering = lingering if lingering is not None else set()
        self.infer: InferEndpoint = app.infer
        # this connection's share of the arena for request bodies
        self.quota = self.infer.body_quota()
        self.restrictions = app.restrictions
        self.max_input = app.max_input
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.pipeline: deque[_Request] = deque()  # read, not yet answered; [0] is active
        self.current: _Request | None = None  # the request being parsed
        self.url = b""
        self.headers: list = []
        self.header_bytes = 0
        self.in_headers = False
        self.read_paused = self.write_paused = False
        self.drained: asyncio.Future | None = None
        self.closing = False  # no more requests: close once the pipeline is answered
        self.error: bytes | None = None  # a protocol error's answer, after the pipeline
        self.addresses = None
        self.last_active = 0.0  # loop time of the last read or finished response
        # when the request line of the request being read began (of the connection,
        # before its first request)
        self.head_started = 0.0
        self.served = False  # a request began on this connection
        self.head_memo: _Head | None = None  # the head read last (see _Head)
        self.lingering: asyncio.TimerHandle | None = None  # see _close

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.last_active = self.head_started = self.loop.time()
        if len(self.connections) >= self.max_connections and not self._make_room():
            self.closing = True  # reads nothing; connection_lost finds nothing to do
            self.error = _closing_error(503, "Service Unavailable")
            self._close()
            return
        self.connections.add(self)

    def _make_room(self) -> bool:
        """At the connection limit: close the keep-alive connection idle the longest,
        if any, for the one just accepted (nginx reuses those; one that has not sent
        its first request yet may be on its way, and has the header deadline)."""
        oldest, since = None, None
        for conn in self.connections:
            if conn.served and conn._waiting() and (since is None
                                                    or conn.last_active < since):
                oldest, since = conn, conn.last_active
        if oldest is None:
            return False
        oldest.shutdown()
        return True

    def _waiting(self) -> bool:
        """Nothing is being read or answered: the connection waits for a request."""
        if self.pipeline or self.in_headers or self.closing:
            return False
        current = self.current
        return current is None or (current.done and current.body_done)

    def overdue(self, now: float, idle: float, header: float, body: float):
        """TIMED_OUT when a request's line and headers, or its body, stopped coming
        past their deadline; IDLE when no request came within the idle timeout (the
        header timeout for a connection's first); else None. Time the server makes a
        request wait (reading paused, a 100-continue not sent yet, requests before it
        still being answered) is not counted against it."""
        if self.closing:
            return None
        if self.in_headers:
            if not self.pipeline and now - self.head_started > header:
                return TIMED_OUT
            return None
        cur = self.current
        if cur is not None and not cur.body_done:
            if self.read_paused or (cur.expect and not cur.done) or (
                    self.pipeline and self.pipeline[0] is not cur):
                return None
            return TIMED_OUT if now - self.last_active > body else None
        if not self._waiting():
            return None
        if not self.served:
            idle = min(idle, header)
        return IDLE if now - self.last_active > idle else None

    def time_out(self) -> None:
        """A request's line, headers or body stopped coming: a 408, and the connection
        closes (after the requests before it are answered)."""
        self.closing = True
        self.error = _closing_error(408, "Request Timeout")
        cur = self.current
        if not self.in_headers and cur is not None and not cur.body_done:
            self._drop(cur)
        self._pause_reading()
        if not self.pipeline:
            self._close()

    def connection_lost(self, exc) -> None:
        self.connections.discard(self)
        self.closing = True
        if self.lingering is not None:
            self.lingering.cancel()
            self.closed_lingering.discard(self)
        requests = set(self.pipeline)
        if self.current is not None:
            requests.add(self.current)
        self.pipeline.clear()  # nothing more starts on this connection
        for req in requests:
            req.gone = True
            req.wake()
            if req.watching and req.task is not None:
                req.task.cancel()  # InferEndpoint.respond sees `gone` and ends quietly
            if req.block is not None:  # a body cut short, or a request never started
                self.infer.core.free_blocks([req.block])
                req.block = req.arena = None
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self._flow()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_active = self.loop.time()
        cur = self.current
        boundary = not self.in_headers and (cur is None or cur.body_done)
        memo = self.head_memo
        if boundary and memo is not None and len(data) == memo.size \
                and data.startswith(memo.head):
            self._repeat(memo, data)
            return
        try:
            self.parser.feed_data(data)
            if self.in_headers:  # bounds what httptools gathers before on_header
                self.header_bytes += len(data)
                if self.header_bytes > 2 * MAX_HEADER_BYTES:
                    self.error = _closing_error(431, "Request header fields too large.")
                    raise httptools.HttpParserError("headers too large")
        except httptools.HttpParserUpgrade:
            # no upgrades served: answer what was read, then close (uvicorn serves the
            # request without upgrading too)
            self.closing = True
        except httptools.HttpParserError as exc:
            if self.error is None:
                log.debug("malformed HTTP request: %s", exc)
                self.error = _closing_error(400, "Invalid HTTP request received.")
            self.closing = True
            cur = self.current
            if not self.in_headers and cur is not None and not cur.body_done:
                self._drop(cur)  # its body broke off: it can never be answered
        if self.closing:
            self._pause_reading()
            if not self.pipeline:
                self._close()
        elif boundary and not self.in_headers and self.current is not cur:
            self._learn(data)

    def _learn(self, data: bytes) -> None:
        """After a read that began a request and ended one: keep its head if the read
        was that request alone and it is one to take the next requests from (see
        _Head). The read's first head and the last request's body must make up the
        whole read, which two requests in it never do."""
        req = self.current
        if not (req.body_done and req.target is not None and req.refusal is None
                and req.keep_alive and req.method == b"POST"):
            return
        end = data.find(b"\r\n\r\n", 0, MEMO_HEAD_MAX) + 4
        if end < 4 or len(data) - end != req.body_size or req.body_size != req.info[3]:
            return  # a long head, more than one request's bytes, or an odd body
        for key, _ in req.headers:
            # chunked: the body's bytes are not the read's; expect: _start answered a
            # 100-continue already, where a repeat would not
            if key == b"transfer-encoding" or key == b"expect":
                return
        self.head_memo = _Head(data[:end], req)

    def _repeat(self, memo: _Head, data: bytes) -> None:
        """A read that repeats `memo`'s head with its body: the request the parser
        would have made of it, started as on_message_complete starts one."""
        self.served = True
        req = _Request()
        req.method = memo.method
        req.keep_alive = True
        req.headers = memo.headers
        req.query = memo.query
        req.raw_path = memo.raw_path
        req.path = memo.path
        req.expect = False
        req.target = memo.target
        req.version = memo.version
        req.info = memo.info
        self._reserve_body(req, memo.info[3], memo.info[1])
        self.current = req
        self.on_body(data[len(memo.head):])
        req.body_done = True
        self._queue(req)

    def _drop(self, req: _Request) -> None:
        """`req` will get no more body (a malformed chunk, a deadline): it leaves the
        pipeline, its handler sees the client gone, and the connection's error (a
        400, uvicorn's answer to a parser error) is written after the requests before
        it are answered; or nothing, if its own response had begun."""
        req.gone = True
        req.wake()
        if req.watching and req.task is not None:
            req.task.cancel()
        if req.block is not None:
            self.infer.core.free_blocks([req.block])
            req.block = req.arena = None
        if req.chunked is not None or (req.done and not req.body_done):
            self.error = None  # its response went out (or began): no second one
        if req in self.pipeline:
            self.pipeline.remove(req)

    # ------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self.in_headers = self.served = True
        self.head_started = self.last_active  # the read that brought its first byte
        self.url = b""
        self.headers = []
        self.header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large()

    def _headers_too_large(self) -> None:
        self.error = _closing_error(431, "Request header fields too large.")
        raise httptools.HttpParserError("headers too large")  # stops the parser

    def on_headers_complete(self) -> None:
        self.in_headers = False
        parser = self.parser
        req = _Request()
        req.method = parser.get_method()
        req.keep_alive = parser.should_keep_alive() and not self.closing
        req.headers = headers = self.headers
        raw = self.url
        if raw[:1] == b"/" and b"?" not in raw and b"#" not in raw:
            req.query = b""  # a path alone, as clients send it: nothing to take apart
        else:
            url = httptools.parse_url(raw)
            raw = url.path
            req.query = url.query or b""
        req.raw_path = raw
        path = raw.decode("ascii")
        req.path = path = unquote(path) if "%" in path else path
        req.expect = False
        for key, value in headers:
            if key == b"expect" and value.lower() == b"100-continue":
                req.expect = True
        req.target = target = infer_target(path) if req.method == b"POST" else None
        # for the ASGI scope alone (the infer fast path has none)
        req.version = parser.get_http_version() if target is None else "1.1"
        if target is not None:
            self._infer_headers(req)
        self.current = req
        self._queue(req)

    def _queue(self, req: _Request) -> None:
        """`req` joins the pipeline: started if it heads it, else reading may pause."""
        self.pipeline.append(req)
        if len(self.pipeline) == 1:
            self._start(req)
        elif len(self.pipeline) > MAX_PIPELINE:
            self._flow()

    def _infer_headers(self, req: _Request) -> None:
        """The fast path's checks before any body: restricted API, input size."""
        if self.restrictions:
            refused = path_refusal(req.path, req.headers, self.restrictions)
            if refused is not None:
                req.refusal = (403, refused[1], False)
                return
        req.info = header_length, encoding, _, length = infer_headers(req.headers)
        if length > self.max_input:  # answered at once, and the body never read
            req.refusal = (400, input_size_message(length, self.max_input, header_length),
                           True)
            req.keep_alive = False
            self.closing = True
            return
        self._reserve_body(req, length, encoding)

    def _reserve_body(self, req: _Request, length: int, encoding) -> None:
        """A large body's place in the arena, where it is received straight."""
        if self.infer.arena_body(length, encoding):
            # None past this connection's or the process's budget for arena bodies:
            # the body is then gathered in process memory as it arrives (on_body)
            got = self.infer.body_buffer(length, self.quota)
            if got is not None:
                req.arena, req.block = got

    def on_body(self, chunk: bytes) -> None:
        req = self.current
        if req.done or req.refusal is not None:
            return  # answered already: the rest of the body is dropped
        n = len(chunk)
        pos = req.body_size
        req.body_size = pos + n
        if req.arena is not None:
            end = min(pos + n, len(req.arena))
            req.arena[pos:end] = chunk[:end - pos]  # the one copy into shared memory
            return
        if req.target is not None and req.body_size > self.max_input:
            # a chunked infer body past the limit: refused, and the connection closes
            header_length = req.info[0]
            req.refusal = (400, input_size_message(req.body_size, self.max_input,
                                                   header_length), True)
            req.keep_alive = False
            req.body = []
            self.closing = True
            if self.pipeline[0] is req and req.task is None:
                self._answer_refusal(req)
            return
        req.body.append(chunk)
        if req.target is None:
            req.wake()
            if req.body_size > BODY_HIGH_WATER:
                self._flow()

    def on_message_complete(self) -> None:
        req = self.current
        req.body_done = True
        if req.target is None:
            req.wake()
        elif self.pipeline and self.pipeline[0] is req and not req.started:
            self._run_infer(req)

    # ------------------------------------------------------------ the pipeline

    def _start(self, req: _Request) -> None:
        """`req` heads the pipeline: answer it (or wait for its body)."""
        if req.target is None:
            req.started = True
            req.task = self.loop.create_task(self._run_asgi(req))
        elif req.refusal is not None:
            self._answer_refusal(req)
        elif req.body_done:
            self._run_infer(req)
        elif req.expect:
            req.expect = False  # sent: the body's deadline runs from here
            self.transport.write(_CONTINUE)

    def _finish(self, req: _Request) -> None:
        """`req`'s response is complete: on to the next request, or close."""
        req.done = True
        req.wake()
        self.last_active = self.loop.time()
        if self.in_headers:  # the next request's head waited on this one, not the client
            self.head_started = self.last_active
        if self.pipeline and self.pipeline[0] is req:
            self.pipeline.popleft()
        if not req.keep_alive:
            self.closing = True
        if self.closing and not req.body_done and self.current is req:
            self.pipeline.clear()  # the rest of the stream is not ours to read
        if self.pipeline:
            self._start(self.pipeline[0])
            self._flow()
        elif self.closing:
            self._close()
        else:
            self._flow()

    def _close(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        error, self.error = self.error, None
        if error is None or not t.can_write_eof():
            if error is not None:
                t.write(error)
            t.close()
            return
        # A protocol error's answer (400, 408, 503): closing with the client's bytes
        # unread would reset the connection, and the reset can destroy the answer
        # before the client reads it. So: the answer, our side shut (FIN), and what
        # the client still sends read and dropped until it closes (eof_received), for
        # LINGER seconds at most (nginx's lingering close)
        t.write(error)
        t.write_eof()
        self.lingering = self.loop.call_later(LINGER, t.abort)
        self.connections.discard(self)  # done with: no longer counts against the limit
        self.closed_lingering.add(self)
        if self.read_paused:
            self.read_paused = False
            t.resume_reading()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None \
                and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    def _flow(self) -> None:
        """Read while the writes drain and the pipeline and request bodies are short."""
        cur = self.current
        full = (self.write_paused or self.closing or len(self.pipeline) > MAX_PIPELINE
                or (cur is not None and cur.target is None and not cur.done
                    and sum(map(len, cur.body)) > BODY_HIGH_WATER))
        if full:
            self._pause_reading()
        elif self.read_paused and not self.transport.is_closing():
            self.read_paused = False
            self.transport.resume_reading()

    def shutdown(self) -> None:
        """The server stops: close now if idle, else after the current response."""
        self.closing = True
        if not self.pipeline:
            self._close()

    # ------------------------------------------------------------ the infer fast path

    def _answer_refusal(self, req: _Request) -> None:
        status, message, close = req.refusal
        if close:
            req.keep_alive = False
        if req.block is not None:
            self.infer.core.free_blocks([req.block])
            req.block = req.arena = None
        out = http_codec.encode_error(message)
        self._write(req, status, [(b"content-type", _JSON),
                                  (b"content-length", b"%d" % len(out))], out)
        req.started = True
        self._finish(req)

    def _run_infer(self, req: _Request) -> None:
        """Send `req` on its way: decoded and started here, and answered from the
        callback that reads its response (`_answered`), with no task or coroutine
        for it (InferEndpoint's prepare and answer; the data plane's start_unary). A
        body to inflate goes a step at a time in a task (InferEndpoint.respond)."""
        req.started = True
        header_length, encoding, _, _ = req.info
        if encoding:
            req.task = self.loop.create_task(self._infer(req))
            return
        body, block = self._take_body(req)
        endpoint = self.infer
        name, version = req.target
        try:
            request = endpoint.prepare(name, version, req.headers, body, block,
                                       header_length)
            block = None  # the core frees it from here on
            req.task = endpoint.start(request,
                                      lambda answer: self._answered(req, request, answer))
        except Exception as exc:  # noqa: BLE001 - every failure is answered
            if block is not None:
                endpoint.core.free_blocks([block])
            self._write(req, *endpoint.error_answer(exc, name, None))
            self._finish(req)
            return
        req.watching = True  # the client gone: connection_lost cancels the request

    def _answered(self, req: _Request, request, answer) -> None:
        """The core's answer to `req` (an InferResult or the exception), from the
        data plane's read of the response: written, and on to the next request."""
        req.watching = False
        req.task = None
        endpoint = self.infer
        try:
            if req.gone:  # the connection went meanwhile: nobody to answer
                if isinstance(answer, InferResult):
                    answer.release()
                return
            name, version = req.target
            if isinstance(answer, BaseException):
                status, headers, out = endpoint.error_answer(answer, name, None)
            else:
                try:
                    status, headers, out = endpoint.answer(name, version, request, answer,
                                                           req.info[2])
                except Exception as exc:  # noqa: BLE001 - an output it cannot encode
                    status, headers, out = endpoint.error_answer(exc, name, None)
            self._write(req, status, headers, out)
            self._finish(req)
        except Exception:  # a bug here must not stop the reading of responses
            log.exception("answering an infer request failed; closing the connection")
            if self.transport is not None:
                self.transport.abort()

    def _take_body(self, req: _Request):
        """(body, arena block or None) of `req`, which no longer holds them."""
        block = req.block
        if block is not None:
            arena = req.arena
            body = arena if req.body_size == len(arena) else arena[:req.body_size]
            req.block = req.arena = None  # the taker frees or hands it on from here
        else:
            body = req.body[0] if len(req.body) == 1 else b"".join(req.body)
            req.body = []
        return body, block

    async def _infer(self, req: _Request) -> None:
        header_length, encoding, accept, _ = req.info
        body, block = self._take_body(req)
        name, version = req.target
        try:
            answer = await self.infer.respond(name, version, req.headers, body, block,
                                              header_length, encoding, accept, req.watch)
        except asyncio.CancelledError:
            if req.gone:
                return
            raise
        if answer is None or req.gone:
            return
        status, headers, out = answer
        self._write(req, status, headers, out)
        self._finish(req)

    def _write(self, req: _Request, status: int, headers, out) -> None:
        """A whole response, in one write (two for a large body, to spare a copy)."""
        transport = self.transport
        if transport.is_closing():
            return
        parts = [_status_line(status)]
        for key, value in headers:
            parts += (key, b": ", value, b"\r\n")
        if not req.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if len(out) < 65536:
            parts.append(out)
            transport.write(b"".join(parts))
        else:
            transport.write(b"".join(parts))
            transport.write(out)

    # ------------------------------------------------------------ ASGI for the rest

    def _scope(self, req: _Request) -> dict:
        if self.addresses is None:
            t = self.transport
            server, client = t.get_extra_info("sockname"), t.get_extra_info("peername")
            self.addresses = (tuple(server[:2]) if server else None,
                              tuple(client[:2]) if client else None)
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
                "http_version": req.version, "server": self.addresses[0],
                "client": self.addresses[1], "scheme": "http",
                "method": req.method.decode("ascii"), "root_path": "",
                "path": req.path, "raw_path": req.raw_path, "query_string": req.query,
                "headers": req.headers}

    async def _run_asgi(self, req: _Request) -> None:
        req.head_only = req.method == b"HEAD"

        async def receive():
            if req.expect and req.chunked is None:  # no response yet
                req.expect = False
                if not self.transport.is_closing():
                    self.transport.write(_CONTINUE)
            while not (req.gone or req.done) and (
                    req.delivered or (not req.body and not req.body_done)):
                req.waiter = self.loop.create_future()
                await req.waiter
            if req.gone or req.done:
                return {"type": "http.disconnect"}
            body = req.body[0] if len(req.body) == 1 else b"".join(req.body)
            req.body = []
            req.delivered = req.body_done
            self._flow()
            return {"type": "http.request", "body": body, "more_body": not req.body_done}

        async def send(message):
            if req.gone:
                return
            kind = message["type"]
            if kind == "http.response.start":
                if req.chunked is not None or req.done:
                    raise RuntimeError("response already started")
                self._asgi_start(req, message)
            elif kind == "http.response.body":
                if req.chunked is None:
                    raise RuntimeError("response not started")
                if req.done:
                    raise RuntimeError("response already complete")
                body = message.get("body", b"")
                more = message.get("more_body", False)
                transport = self.transport
                if body and not req.head_only:
                    if req.chunked:
                        transport.write(b"%x\r\n" % len(body) + body + b"\r\n")
                    else:
                        transport.write(body)
                if not more:
                    if req.chunked and not req.head_only:
                        transport.write(b"0\r\n\r\n")
                    self._finish(req)
                elif self.write_paused:
                    self.drained = self.drained or self.loop.create_future()
                    if self.drained.done():
                        self.drained = self.loop.create_future()
                    await self.drained
            else:
                raise RuntimeError(f"unexpected ASGI message {kind!r}")

        try:
            await self.app(self._scope(req), receive, send)
        except Exception:
            log.exception("HTTP request %s %s failed", req.method.decode(), req.path)
            if req.done or req.gone:
                return  # answered (starlette re-raises after its 500) or nobody to tell
            if req.chunked is None:
                req.keep_alive = False
                self.transport.write(_closing_error(500, "Internal Server Error"))
                self._finish(req)
            else:
                self.transport.close()  # a response cut short cannot be ended
            return
        if not req.done and not req.gone:
            if req.chunked is None:  # the app sent nothing: as uvicorn, a 500
                req.keep_alive = False
                self.transport.write(_closing_error(500, "Internal Server Error"))
                self._finish(req)
            else:
                self.transport.close()  # an incomplete response cannot be ended

    def _asgi_start(self, req: _Request, message) -> None:
        status = message["status"]
        parts = [_status_line(status)]
        length = False
        for key, value in message.get("headers", ()):
            key = bytes(key).lower()
            if key == b"content-length":
                length = True
            elif key == b"connection" and bytes(value).lower() == b"close":
                req.keep_alive = False
                continue
            elif key == b"transfer-encoding":
                continue  # ours to choose
            parts += (key, b": ", bytes(value), b"\r\n")
        chunked = not length and status >= 200 and status not in (204, 304) \
            and not req.head_only
        if chunked:
            parts.append(b"transfer-encoding: chunked\r\n")
        if not req.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        req.chunked = chunked
        self.transport.write(b"".join(parts))


async def serve(app, sock, idle_timeout: float = IDLE_TIMEOUT,
                header_timeout: float = HEADER_TIMEOUT, body_timeout: float = BODY_TIMEOUT,
                max_connections: int | None = None) -> "Server":
    """Serve `app` (http_server's _HttpApp) on the listening socket `sock`, with the
    deadlines and connection limit the module's docstring describes (seconds;
    `max_connections` None: default_max_connections())."""
    connections: set[HttpProtocol] = set()
    lingering: set[HttpProtocol] = set()
    limit = default_max_connections() if max_connections is None else max_connections
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HttpProtocol(app, connections, limit, lingering), sock=sock, backlog=2048)
    return Server(server, connections, loop.create_task(
        sweep(connections, idle_timeout, header_timeout, body_timeout)), lingering)


class Server:
    """The listening server and its open connections."""

    def __init__(self, server, connections: set, sweeper: asyncio.Task | None = None,
                 lingering: set | None = None):
        self.server = server
        self.connections = connections
        self.sweeper = sweeper
        self.lingering = lingering if lingering is not None else set()  # see _close

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close idle connections, give busy ones `timeout` seconds."""
        if self.sweeper is not None:
            self.sweeper.cancel()
        self.server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections) + list(self.lingering):
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0.05)  # the aborted connections' tasks see it and end


class NativeHttpServer:
    """serve() as an engine, started and stopped as the other engines are
    (engines.py): `app` on the listening socket `sock`."""

    def __init__(self, app, sock):
        self.app = app
        self.sock = sock
        self.server: Server | None = None

    async def start(self) -> None:
        self.server = await serve(self.app, self.sock)

    async def stop(self, grace: float | None = 5.0) -> None:
        if self.server is not None:
            await self.server.stop(grace or 0.0)
