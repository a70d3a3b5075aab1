"""frontend.transport.http1: the native HTTP/1.1 transport over a fake DataPlane, on a real
socket: keep-alive, pipelining, chunked bodies, 100-continue, malformed requests,
limits, large bodies into the arena, and a client leaving a streaming response."""

import asyncio
import json
import socket
import threading
import time

import httptools
import numpy as np
import pytest
import tritonclient.http as httpclient
from starlette.routing import Route
from tritonclient.grpc import model_config_pb2

from frontend.transport import http1
from frontend.http_server import BODY_IN_ARENA_MIN, make_http_app
from frontend.http_stream import read_body
from frontend.types import ModelView
from tests.unit.test_http_server import IDENTITY, FakeCore, client_result, infer_body


class ArenaCore(FakeCore):
    """FakeCore with a body_buffer, as SchedulerDataPlane offers: counts blocks."""

    def __init__(self):
        super().__init__()
        self.blocks = []
        self.freed = []

    def body_buffer(self, n, quota=None):
        block = len(self.blocks)
        self.blocks.append(n)
        return memoryview(bytearray(n)), block

    def free_blocks(self, blocks):
        self.freed += blocks


class Streamer:
    """A raw ASGI endpoint that streams chunks until the client disconnects."""

    def __init__(self):
        self.saw_disconnect = threading.Event()

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        stop = asyncio.get_running_loop().create_future()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            self.saw_disconnect.set()
            stop.set_result(None)

        watcher = asyncio.get_running_loop().create_task(watch())
        while not stop.done():
            await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
            await asyncio.sleep(0.01)
        watcher.cancel()


class Echo:
    """A raw ASGI endpoint that answers with the request's body."""

    async def __call__(self, scope, receive, send):
        body = await read_body(receive)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


class Flood:
    """Streams 64 KiB chunks as fast as the transport takes them, counting, until the
    client disconnects (once it has gone, send returns at once: the ~100,000 sends
    left cost ~0.7 s of CPU)."""

    CHUNK = bytes(65536)

    def __init__(self):
        self.sent = 0
        self.ended = threading.Event()
        self.send_since: float | None = None  # when the send now waiting began

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        gone = asyncio.Event()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            while self.sent < 100_000 and not gone.is_set():
                self.send_since = time.monotonic()
                await send({"type": "http.response.body", "body": self.CHUNK,
                            "more_body": True})
                self.send_since = None
                self.sent += 1
                await asyncio.sleep(0)
        finally:
            watcher.cancel()
            self.ended.set()


async def boom(request):
    raise RuntimeError("a bug in a handler")


class Target:
    """A raw ASGI endpoint that answers with how the request target was taken apart."""

    async def __call__(self, scope, receive, send):
        body = json.dumps({"path": scope["path"], "raw_path": scope["raw_path"].decode(),
                           "query": scope["query_string"].decode()}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def streamer():
    return Streamer()


@pytest.fixture
def flood():
    return Flood()


@pytest.fixture
def core():
    return ArenaCore()


@pytest.fixture
def port(core, streamer, flood):
    yield from _serve(core, streamer, flood)


@pytest.fixture
def idle_port(core, streamer, flood):
    """A server that closes keep-alive connections idle for 0.3 s."""
    yield from _serve(core, streamer, flood, idle_timeout=0.3)


def _serve(core, streamer, flood, **options):
    app = make_http_app(core, routes=[Route("/stream", streamer),
                                                Route("/echo", Echo(), methods=["POST"]),
                                                Route("/boom", boom),
                                                Route("/tar get", Target()),
                                                Route("/flood", flood)],
                        restrictions={"health": ("api-key", "yes")},
                        max_input_size=4 << 20)
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    holder, started = [], threading.Event()

    def run():
        asyncio.set_event_loop(loop)
        holder.append(loop.run_until_complete(http1.serve(app, sock, **options)))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    yield sock.getsockname()[1]
    asyncio.run_coroutine_threadsafe(holder[0].stop(1.0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


class Responses:
    """Reads responses off a socket with httptools."""

    def __init__(self, sock):
        self.sock = sock
        self.done = []
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False

    def on_message_begin(self):
        self.headers, self.body = {}, b""

    def on_header(self, name, value):
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body):
        self.body += body

    def on_message_complete(self):
        self.done.append((self.parser.get_status_code(), self.headers, self.body))

    def read(self, n=1, timeout=10.0):
        self.sock.settimeout(timeout)
        while len(self.done) < n:
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                break
            self.parser.feed_data(data)
        out, self.done = self.done[:n], self.done[n:]
        return out

    def is_closed(self, timeout=5.0):
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    return sock, Responses(sock)


def infer_request(body, headers, path="/v2/models/identity/infer", extra=b""):
    head = b"".join(b"%s: %s\r\n" % (k.encode(), str(v).encode()) for k, v in headers)
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%scontent-length: %d\r\n%s\r\n"
            % (path.encode(), head, len(body), extra) + body)


def check_identity(status, head, body, data):
    assert status == 200, body
    out = client_result(head, body).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, data)


def test_keep_alive_and_tritonclient(port):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.get_server_metadata()["name"] == "shmserve"
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        for _ in range(3):  # one connection, several requests
            inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(data)
            result = client.infer("identity", [inp])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def test_pipelined_requests_answered_in_order(port):
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        sock.sendall(infer_request(body, headers)
                     + b"GET /v2/models/identity HTTP/1.1\r\nHost: x\r\n\r\n"
                     + infer_request(body, headers, "/v2/models/identity/versions/1/infer")
                     + b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        first, meta, third, server = r.read(4)
        check_identity(*first, data)
        assert meta[0] == 200 and json.loads(meta[2])["name"] == "identity"
        check_identity(*third, data)
        assert server[0] == 200 and json.loads(server[2])["name"] == "shmserve"


def test_chunked_bodies_both_routes(port):
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        head = b"".join(b"%s: %s\r\n" % (k.encode(), str(v).encode()) for k, v in headers)
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 50]), body[i:i + 50])
                          for i in range(0, len(body), 50)) + b"0\r\n\r\n"
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n%s"
                     b"transfer-encoding: chunked\r\n\r\n" % head + chunks)
        check_identity(*r.read()[0], data)
        # a route of the starlette app reads a chunked body too, in pieces
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n"
                     b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n")
        time.sleep(0.05)
        sock.sendall(b"3\r\nabc\r\n0\r\n\r\n")
        assert r.read()[0][::2] == (200, b"{}abc")
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")  # still in step
        assert r.read()[0][0] == 200


def test_content_length_with_chunked_is_refused(port):
    """Rule (README, deliberate differences): a request with both Content-Length and
    Transfer-Encoding: chunked is a 400 and a close, never read by either length
    (RFC 9112, 6.3: a request-smuggling door); Triton takes it."""
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        head = b"".join(b"%s: %s\r\n" % (k.encode(), str(v).encode()) for k, v in headers)
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n%s"
                     b"content-length: %d\r\ntransfer-encoding: chunked\r\n\r\n"
                     % (head, len(chunks)) + chunks)
        status, head, _ = r.read()[0]
        assert status == 400
        assert head["connection"] == "close" and r.is_closed()


def test_expect_100_continue(port):
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        request = infer_request(body, headers, extra=b"expect: 100-continue\r\n")
        head, payload = request[:-len(body)], request[-len(body):]
        sock.sendall(head)
        sock.settimeout(5)
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(payload)
        check_identity(*r.read()[0], data)


def test_input_too_large_is_refused_before_the_body(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                     b"content-length: %d\r\nexpect: 100-continue\r\n\r\n" % (5 << 20))
        status, head, body = r.read()[0]
        assert status == 400 and "exceeds" in json.loads(body)["error"]
        assert head["connection"] == "close" and r.is_closed()


def test_chunked_input_too_large_is_refused(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        piece = b"x" * (1 << 20)
        try:
            for _ in range(6):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = r.read()[0]
        assert status == 400 and "exceeds" in json.loads(body)["error"]


def test_restricted_api_on_both_paths(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\napi-key: yes\r\n\r\n")
        (s1, _, b1), (s2, _, _) = r.read(2)
        assert s1 == 403 and "restricted" in json.loads(b1)["error"] and s2 == 200


def test_large_body_lands_in_the_arena(port, core):
    sock, r = connect(port)
    with sock:
        n = BODY_IN_ARENA_MIN // 64 + 1
        data, body, headers = infer_body(batch=n)
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(IDENTITY)
        config.max_batch_size = n
        core.models["identity"] = [ModelView("identity", 1, "READY", "", config)]
        request = infer_request(body, headers)
        for i in range(0, len(request), 100_000):  # in pieces, as a network delivers
            sock.sendall(request[i:i + 100_000])
        check_identity(*r.read()[0], data)
        assert core.blocks == [len(body)]


@pytest.mark.parametrize("garbage", [b"NOT HTTP AT ALL\r\n\r\n",
                                     b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
                                     b"POST /v2/models/identity/infer HTTP/1.1\r\n"
                                     b"content-length: zz\r\n\r\n"])
def test_malformed_request_is_400_and_close(port, garbage):
    sock, r = connect(port)
    with sock:
        sock.sendall(garbage)
        status, head, _ = r.read()[0]
        assert status == 400 and head["connection"] == "close" and r.is_closed()


# Malformed chunked bodies (issue 25: 25 of 3,538 fuzz cases hung). httptools raises
# mid-body, after the request was queued: the request waited for a body that would
# never end, and the connection for the request. Now: uvicorn's answer to a parser
# error, a 400 {"error": "Invalid HTTP request received."}, and the connection closes
# (Triton closes without an answer).
MALFORMED_CHUNKED = {
    "bad-size": b"zz\r\nabc\r\n0\r\n\r\n",
    "size-2^64": b"10000000000000000\r\n" + b"a" * 10 + b"\r\n",
    "negative-size": b"-3\r\nabc\r\n0\r\n\r\n",
    "ext-bare-lf": b"3;a\nb\r\nabc\r\n0\r\n\r\n",
    "ext-bare-cr": b"3;a\rb\r\nabc\r\n0\r\n\r\n",
    "size-bare-lf": b"3\nabc\r\n0\r\n\r\n",
    "no-crlf-after-data": b"3\r\nabcXY0\r\n\r\n",
    "bad-trailer": b"3\r\nabc\r\n0\r\nno colon\r\n\r\n",
    "second-chunk-bad": b"3\r\nabc\r\n2 2\r\nab\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("path", ["/v2/models/identity/infer", "/echo"])
@pytest.mark.parametrize("body", list(MALFORMED_CHUNKED.values()),
                         ids=list(MALFORMED_CHUNKED))
def test_a_malformed_chunked_body_is_400_and_close(port, path, body):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n"
                     b"\r\n" % path.encode() + body)
        status, head, text = r.read(timeout=5.0)[0]
        assert (status, json.loads(text)) == (400, {"error": "Invalid HTTP request received."})
        assert head["content-type"] == "application/json"
        assert head["connection"] == "close" and r.is_closed()


def test_a_malformed_chunked_body_after_a_good_request_is_answered_in_order(port, core):
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        sock.sendall(infer_request(body, headers)
                     + b"POST /echo HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n"
                     b"\r\n3\r\nabc\r\nzz\r\n")
        (first, second) = r.read(2, timeout=5.0)
        check_identity(*first, data)
        assert second[0] == 400 and r.is_closed()


def test_headers_too_large_is_431_and_close(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nx-big: %s\r\n\r\n"
                     % (b"a" * (http1.MAX_HEADER_BYTES + 10)))
        status, _, _ = r.read()[0]
        assert status == 431 and r.is_closed()


def test_http10_closes_after_the_response(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"GET /v2 HTTP/1.0\r\n\r\n")
        status, head, _ = r.read()[0]
        assert status == 200 and head["connection"] == "close" and r.is_closed()


def test_connection_close_requested(port):
    sock, r = connect(port)
    with sock:
        data, body, headers = infer_body()
        sock.sendall(infer_request(body, headers + [("Connection", "close")]))
        check_identity(*r.read()[0], data)
        assert r.is_closed()


def test_disconnect_during_a_streaming_response(port, streamer):
    sock, r = connect(port)
    sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    got = b""
    while b"tick" not in got:
        got += sock.recv(4096)
    assert b"transfer-encoding: chunked" in got.lower()
    sock.close()
    assert streamer.saw_disconnect.wait(5)


def test_disconnect_cancels_an_infer_in_flight(port, core):
    started, cancelled = threading.Event(), threading.Event()
    infer = core.infer

    async def slow(request, refusal=""):
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return await infer(request, refusal)

    core.infer = slow
    sock, r = connect(port)
    data, body, headers = infer_body()
    sock.sendall(infer_request(body, headers))
    assert started.wait(5)
    sock.close()
    assert cancelled.wait(5)
    time.sleep(0.05)


def test_a_long_pipeline_pauses_reading_and_is_answered_whole(port):
    sock, r = connect(port)
    with sock:
        n = 3 * http1.MAX_PIPELINE
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n" * n)
        answers = r.read(n)
        assert len(answers) == n and all(a[0] == 200 for a in answers)


def test_head_has_no_body(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\nGET /v2 HTTP/1.1\r\n"
                     b"Host: x\r\n\r\n")
        sock.settimeout(5)
        got = b""
        while b"shmserve" not in got:
            got += sock.recv(65536)
        assert got.count(b"HTTP/1.1 200") == 2 and got.count(b"shmserve") == 1


def test_a_failing_handler_is_500_and_the_connection_goes_on(port):
    sock, r = connect(port)
    with sock:
        sock.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        (s1, _, _), (s2, _, _) = r.read(2)
        assert (s1, s2) == (500, 200)


def test_a_client_that_does_not_read_holds_the_sender_back(port, flood):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.sendall(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")

    def held():  # one send has waited 0.3 s for the writes to drain
        since = flood.send_since
        return since is not None and time.monotonic() - since > 0.3

    deadline = time.monotonic() + 10
    while not held() and time.monotonic() < deadline:
        time.sleep(0.02)
    # unheld, the flood sends 64 KiB chunks as fast as the loop turns: thousands
    assert held() and flood.sent < 1000, flood.sent
    sock.close()
    assert flood.ended.wait(5)


def test_an_infer_client_that_does_not_read_is_no_longer_read(port, core):
    """Infer requests pipelined by a client that never reads its answers (each answer
    ~200 KiB): once the answers fill the socket and the transport's buffer, reading
    stops, so the requests the core is given stop at a bound, whatever the client
    still sends."""
    started = []
    infer = core.infer

    async def counting(request, refusal=""):
        started.append(request.id)
        return await infer(request, refusal)
    core.infer = counting
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.zeros((1, 16), np.float32))
    b = httpclient.InferInput("INPUT1", [1, 1], "BYTES")
    b.set_data_from_numpy(np.array([[b"x" * (200 << 10)]], dtype=object))
    body, length = httpclient.InferenceServerClient.generate_request_body([a, b])
    request = infer_request(body, [("Inference-Header-Content-Length", length)])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(1.0)
    sent = 0
    with sock:
        try:
            while sent < 500:  # 100 MB, unheld
                sock.sendall(request)
                sent += 1
        except socket.timeout:
            pass
        # the count holds still once reading has stopped (polled, bounded)
        deadline, last = time.monotonic() + 10, -1
        while len(started) != last and time.monotonic() < deadline:
            last = len(started)
            time.sleep(0.3)
        assert sent < 500, "the server kept reading"
        # the pipeline's requests, and the answers the kernel's send buffer took
        # before the transport's own filled (its largest: tcp_wmem's third figure)
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            kernel = int(f.read().split()[2]) // (200 << 10)
        assert len(started) <= http1.MAX_PIPELINE + 2 + kernel, (len(started), kernel)


def test_idle_keep_alive_connections_are_closed_and_busy_ones_are_not(idle_port):
    """A keep-alive connection that waits for a request past the idle timeout is
    closed by the server (as uvicorn's timeout_keep_alive did); one in the middle of a
    response is not, however long it takes."""
    idle, r = connect(idle_port)
    busy, _ = connect(idle_port)
    with idle, busy:
        idle.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert r.read()[0][0] == 200
        busy.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        assert r.is_closed(timeout=5.0), "the idle connection was not closed"
        assert time.monotonic() - start >= 0.2  # not before its time
        busy.settimeout(5)
        deadline = time.monotonic() + 1.0  # past the timeout, ticks keep coming
        while time.monotonic() < deadline:
            assert busy.recv(4096), "the streaming connection was closed"


@pytest.mark.parametrize("sent, path, raw, query", [
    ("/tar%20get", "/tar get", "/tar%20get", ""),
    ("/tar%20get?a=1&b=%20", "/tar get", "/tar%20get", "a=1&b=%20"),
    ("http://x:1/tar%20get?q", "/tar get", "/tar%20get", "q"),  # absolute form
])
def test_the_request_target_is_taken_apart_as_uvicorn_does(port, sent, path, raw, query):
    """A plain path is taken as it is (the infer route's case); a query or an
    absolute-form target goes through httptools' URL parser."""
    sock, r = connect(port)
    with sock:
        data, infer, headers = infer_body()
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % sent.encode()
                     # the infer route behind a query string
                     + infer_request(infer, headers, "/v2/models/identity/infer?x=1"))
        (status, _, body), answer = r.read(2)
    assert status == 200
    assert json.loads(body) == {"path": path, "raw_path": raw, "query": query}
    check_identity(*answer, data)
