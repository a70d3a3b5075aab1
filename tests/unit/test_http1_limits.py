"""frontend/transport/http1.py under slow and many clients (issue 25): the deadlines for a
request's head and body (nginx's client_header_timeout and client_body_timeout) and
the connection limit, at small values through serve()'s arguments."""

import selectors
import socket
import time

import pytest

from tests.unit.test_http1 import (ArenaCore, Flood, Streamer, _serve, connect,
                                   infer_body, infer_request)

pytestmark = pytest.mark.timeout(60)

LONG = 300.0  # a deadline a test does not reach


@pytest.fixture
def serve():
    """serve(**options) -> the port of a server with those options."""
    servers = []

    def start(**options):
        gen = _serve(ArenaCore(), Streamer(), Flood(), **options)
        servers.append(gen)
        return next(gen)

    yield start
    for gen in servers:
        next(gen, None)


def closed_within(sock, seconds: float) -> bytes | None:
    """What the server sent before closing, if it closed within `seconds`; None if
    it did not (a bound, not a pace: returns as soon as it closes)."""
    deadline = time.monotonic() + seconds
    got = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            return None
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data
    return None


def test_a_request_head_that_stops_is_408_and_close(serve):
    port = serve(idle_timeout=LONG, header_timeout=0.3, body_timeout=LONG)
    sock, _ = connect(port)
    with sock:
        start = time.monotonic()
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        got = closed_within(sock, 10.0)
        assert got is not None, "the connection was held past its header deadline"
        assert got.startswith(b"HTTP/1.1 408 ") and b"connection: close" in got
        assert time.monotonic() - start >= 0.25  # not before its time


def test_a_trickling_head_is_cut_at_its_deadline_however_it_keeps_coming(serve):
    """The header deadline counts from the request's first byte, not the last read:
    a byte every 50 ms keeps no connection past it (slowloris)."""
    port = serve(idle_timeout=LONG, header_timeout=0.3, body_timeout=LONG)
    sock, _ = connect(port)
    with sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nX-Slow: ")
        deadline = time.monotonic() + 10.0
        got, closed = b"", False
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except OSError:
                pass
            sock.settimeout(0.05)  # the trickle's pace, and a bound on each read
            try:
                data = sock.recv(65536)
                got += data
                closed = not data
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
        assert closed and got.startswith(b"HTTP/1.1 408 "), got


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(serve):
    # nginx: a new connection's first request has client_header_timeout, not the
    # keep-alive idle timeout; closed without an answer (no request to answer)
    port = serve(idle_timeout=LONG, header_timeout=0.3, body_timeout=LONG)
    sock, _ = connect(port)
    with sock:
        assert closed_within(sock, 10.0) == b""


def test_a_body_that_stops_is_408_and_close_and_one_that_trickles_is_served(serve):
    port = serve(idle_timeout=LONG, header_timeout=LONG, body_timeout=0.3)
    for path in (b"/echo", b"/v2/models/identity/infer"):
        sock, _ = connect(port)
        with sock:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n"
                         b"0123456789" % path)
            got = closed_within(sock, 10.0)
            assert got is not None and got.startswith(b"HTTP/1.1 408 "), (path, got)
    # client_body_timeout is between two reads: a body that keeps coming, slowly, is
    # served however long it takes in all
    sock, r = connect(port)
    with sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: 20\r\n\r\n")
        for i in range(10):
            time.sleep(0.1)  # the trickle is the input, not a wait for the server
            sock.sendall(b"%02d" % i)
        assert r.read()[0][::2] == (200, b"00010203040506070809")


def test_a_normal_client_is_served_while_hundreds_of_slow_senders_are_held(serve):
    """400 connections each hold a request head that never ends (the server keeps
    them: the deadline is 60 s); a normal client opened meanwhile is answered at once,
    and so is one that was there before them."""
    port = serve(idle_timeout=LONG, body_timeout=LONG, max_connections=1000)
    before, r0 = connect(port)
    slow = []
    try:
        before.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert r0.read()[0][0] == 200
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nX-A: ")
            slow.append(s)
        sock, r = connect(port)
        with sock:
            data, body, headers = infer_body()
            start = time.monotonic()
            sock.sendall(infer_request(body, headers))
            status, _, _ = r.read(timeout=10.0)[0]
            assert status == 200 and time.monotonic() - start < 5.0
        before.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert r0.read()[0][0] == 200
        # none of the slow senders was dropped (their deadline is far)
        held = 0
        for s in slow:
            s.setblocking(False)
            try:
                held += s.recv(1) != b""
            except BlockingIOError:
                held += 1
        assert held == 400
    finally:
        before.close()
        for s in slow:
            s.close()


def closed_among(socks, at_least: int, seconds: float) -> list:
    """The sockets the server closed (what each got first), waiting until `at_least`
    of them are or `seconds` pass (a bound)."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed, deadline = {}, time.monotonic() + seconds
    try:
        while len(closed) < at_least and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                got = closed_within(s, 1.0)
                closed[s] = got
                sel.unregister(s)
    finally:
        sel.close()
    return list(closed.values())


def test_past_the_connection_limit_new_ones_are_refused_until_deadlines_free_room(serve):
    """50 connections allowed: of 60 slow senders, 10 are refused with a 503 and a
    close; so is a normal client while all 50 are taken. When the slow senders' header
    deadline passes, they get their 408 and a normal client is served."""
    port = serve(idle_timeout=LONG, header_timeout=2.0, body_timeout=LONG,
                 max_connections=50)
    slow = []
    try:
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port))
            slow.append(s)
            try:
                s.sendall(b"GET /v2 HTTP/1.1\r\nX-A: ")
            except OSError:
                pass
        refused = closed_among(slow, 10, 10.0)
        assert len(refused) == 10, refused
        assert all(got == b"" or got.startswith(b"HTTP/1.1 503 ") for got in refused)
        assert any(got.startswith(b"HTTP/1.1 503 ") for got in refused)
        sock, _ = connect(port)
        with sock:
            got = closed_within(sock, 5.0)
            assert got is not None and (got == b"" or got.startswith(b"HTTP/1.1 503 "))
        timed_out = closed_among(slow, 60, 20.0)
        assert len(timed_out) == 60 and sum(
            got.startswith(b"HTTP/1.1 408 ") for got in timed_out) == 50
        sock, r = connect(port)
        with sock:
            sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert r.read(timeout=5.0)[0][0] == 200
    finally:
        for s in slow:
            s.close()


def test_at_the_limit_a_new_connection_takes_the_place_of_the_longest_idle(serve):
    """nginx reuses idle keep-alive connections when it runs out: the oldest idle
    keep-alive connection is closed for the new one; slow senders are not."""
    port = serve(idle_timeout=LONG, body_timeout=LONG, max_connections=10)
    idle, r_idle = connect(port)
    slow = []
    try:
        idle.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert r_idle.read()[0][0] == 200
        for _ in range(9):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /v2 HTTP/1.1\r\nX-A: ")
            slow.append(s)
        sock, r = connect(port)
        with sock:
            sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert r.read(timeout=5.0)[0][0] == 200
        assert closed_within(idle, 5.0) is not None
        assert all(closed_within(s, 0.01) is None for s in slow)
    finally:
        idle.close()
        for s in slow:
            s.close()
