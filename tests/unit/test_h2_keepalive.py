"""transport/h2_keepalive.py through a native gRPC connection driven frame by frame
(test_h2's Peer): PING strikes and GOAWAY too_many_pings, keepalive PINGs and their
watchdog, max-pings-without-data, max connection age with its two GOAWAYs and grace,
with grpc-core's meaning of each of Triton's flags. Small values; time is real, so a
deadline the test must beat (a timeout, a grace) is kept well above a busy machine's
stalls."""

import asyncio
import struct
from unittest import mock

import grpc
import pytest

from frontend.transport import h2
from frontend.transport.grpc_native import NativeGrpcServer
from frontend.transport.h2_keepalive import (GOAWAY_PING, INT_MAX, KEEPALIVE_PING,
                                             KeepaliveSettings)
from tests.unit.test_h2 import Peer, _echo_handlers, run

pytestmark = pytest.mark.timeout(30)


def peer(keepalive: KeepaliveSettings, handlers=None) -> Peer:
    """A Peer whose server has these settings (its connection makes its policy from
    them, as every connection of a NativeGrpcServer does)."""
    with mock.patch.object(NativeGrpcServer, "keepalive", keepalive):
        return Peer(handlers or _echo_handlers())


async def until(predicate, timeout: float = 5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def ping(data: bytes = b"cli-ping", ack: bool = False) -> bytes:
    return h2.frame(h2.PING, h2.ACK if ack else 0, 0, data)


def pings_from_server(p: Peer, opaque: bytes):
    return [f for f in p.read() if f[0] == h2.PING and not f[1] & h2.ACK
            and f[3] == opaque]


def goaways(p: Peer):
    """[(last stream, code, debug data)] of every GOAWAY the server sent."""
    return [struct.unpack(">II", f[3][:8]) + (f[3][8:],)
            for f in p.read() if f[0] == h2.GOAWAY]


def blocking_handlers():
    """/s/Hold runs until its event is set; the rest are test_h2's."""
    started, release = asyncio.get_running_loop().create_future(), asyncio.Event()

    async def hold(request, context):
        if not started.done():
            started.set_result(context)
        await release.wait()
        return b"done"

    handlers = _echo_handlers()
    handlers["/s/Hold"] = grpc.unary_unary_rpc_method_handler(hold)
    return handlers, started, release


# ------------------------------------------------------------------- PING strikes


@run
async def test_pings_too_often_during_a_call_get_goaway_too_many_pings():
    """--grpc-http2-max-ping-strikes=2, min interval 10 s: the first PING is free,
    the next two are strikes, the fourth is one too many: GOAWAY ENHANCE_YOUR_CALM
    with grpc-core's debug data, naming the last stream, and the connection closes."""
    handlers, started, _ = blocking_handlers()
    p = peer(KeepaliveSettings(http2_min_recv_ping_interval_without_data_ms=10_000,
                               http2_max_ping_strikes=2), handlers)
    p.request(1, "/s/Hold", b"")
    await started
    for i in range(3):
        p.send(ping(b"ping-%03d" % i))
    assert not p.transport.closed and goaways(p) == []
    assert len([f for f in p.frames if f[0] == h2.PING and f[1] & h2.ACK]) == 3
    p.send(ping())
    assert p.transport.closed
    assert goaways(p) == [(1, h2.ENHANCE_YOUR_CALM, b"too_many_pings")]


@run
async def test_headers_or_data_sent_forgive_the_strikes():
    """grpc-core resets its PING clock whenever it sends HEADERS or DATA: a client
    that pings after each reply (as a BDP estimator does) is never struck out."""
    p = peer(KeepaliveSettings(http2_min_recv_ping_interval_without_data_ms=10_000,
                               http2_max_ping_strikes=1))
    for sid in range(1, 20, 2):
        p.request(sid, "/s/Echo", b"x")
        await p.settle()
        p.send(ping())
        p.send(ping())  # one strike: allowed
    assert not p.transport.closed and goaways(p) == []
    p.send(ping())
    p.send(ping())  # no reply in between: the second strike
    assert goaways(p)[-1][1:] == (h2.ENHANCE_YOUR_CALM, b"too_many_pings")


@run
async def test_without_calls_pings_are_struck_at_two_hours_unless_permitted():
    """While no call runs, a PING within two hours of the last is a strike whatever
    the minimum interval; --grpc-keepalive-permit-without-calls=true lifts that."""
    strict = peer(KeepaliveSettings(http2_min_recv_ping_interval_without_data_ms=0))
    for _ in range(3):
        strict.send(ping())
    assert not strict.transport.closed
    strict.send(ping())
    assert goaways(strict) == [(0, h2.ENHANCE_YOUR_CALM, b"too_many_pings")]
    permitted = peer(KeepaliveSettings(http2_min_recv_ping_interval_without_data_ms=0,
                                       keepalive_permit_without_calls=True))
    for _ in range(20):
        permitted.send(ping())
    assert not permitted.transport.closed and goaways(permitted) == []


@run
async def test_max_ping_strikes_zero_means_no_limit():
    p = peer(KeepaliveSettings(http2_max_ping_strikes=0))
    for _ in range(50):
        p.send(ping())
    assert not p.transport.closed and goaways(p) == []


# ----------------------------------------------------------------- keepalive PINGs


@run
async def test_keepalive_pings_a_quiet_connection_with_a_call_and_drops_a_dead_one():
    """Quiet for a keepalive period with a call running: the server PINGs; an ACK
    keeps the connection, and the next period brings the next PING; a PING left
    unanswered past the timeout drops the connection."""
    handlers, started, _ = blocking_handlers()
    p = peer(KeepaliveSettings(keepalive_time_ms=20, keepalive_timeout_ms=500), handlers)
    p.request(1, "/s/Hold", b"")
    await started
    await until(lambda: pings_from_server(p, KEEPALIVE_PING))
    p.send(ping(KEEPALIVE_PING, ack=True))
    await until(lambda: len(pings_from_server(p, KEEPALIVE_PING)) == 2)
    assert not p.transport.closed
    await until(lambda: p.transport.closed)  # this one is never answered


@run
async def test_any_byte_read_during_the_timeout_counts_as_alive():
    """As grpc-core, which cancels the watchdog on every read: a client that sends
    something (here a WINDOW_UPDATE) but never ACKs is not dropped."""
    handlers, started, _ = blocking_handlers()
    p = peer(KeepaliveSettings(keepalive_time_ms=20, keepalive_timeout_ms=500,
                               http2_max_pings_without_data=0), handlers)
    p.request(1, "/s/Hold", b"")
    await started
    for n in range(1, 4):
        await until(lambda: len(pings_from_server(p, KEEPALIVE_PING)) == n)
        p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)))
    assert not p.transport.closed


@run
async def test_no_keepalive_ping_without_calls_unless_permitted():
    """No call running: no keepalive PING (grpc-core's default); permitted without
    calls, the same idle connection is pinged."""
    quiet = peer(KeepaliveSettings(keepalive_time_ms=10))
    permitted = peer(KeepaliveSettings(keepalive_time_ms=10,
                                       keepalive_permit_without_calls=True))
    await until(lambda: pings_from_server(permitted, KEEPALIVE_PING))
    await asyncio.sleep(0.2)  # twenty periods: what is being tested is that none come
    assert pings_from_server(quiet, KEEPALIVE_PING) == []


@run
async def test_max_pings_without_data_holds_pings_until_the_server_sends_data():
    """--grpc-http2-max-pings-without-data=1: after one keepalive PING, none until
    the server has sent HEADERS or DATA (a reply); then they go out again."""
    handlers, started, _ = blocking_handlers()
    p = peer(KeepaliveSettings(keepalive_time_ms=10, http2_max_pings_without_data=1),
             handlers)
    p.request(1, "/s/Hold", b"")
    await started
    await until(lambda: pings_from_server(p, KEEPALIVE_PING))
    p.send(ping(KEEPALIVE_PING, ack=True))
    await asyncio.sleep(0.2)  # twenty periods: none may come
    assert len(pings_from_server(p, KEEPALIVE_PING)) == 1
    p.request(3, "/s/Echo", b"x")  # its reply is HEADERS and DATA from the server
    await until(lambda: len(pings_from_server(p, KEEPALIVE_PING)) == 2)


# ------------------------------------------------------------------------------ age


@run
async def test_max_connection_age_two_goaways_then_close_when_calls_are_done():
    """At the age: GOAWAY NO_ERROR naming 2^31-1 and a PING; a stream the client
    opens meanwhile is served; the PING's ACK brings the final GOAWAY naming it; a
    later stream is refused; the connection closes once the running call is done."""
    handlers, started, release = blocking_handlers()
    p = peer(KeepaliveSettings(max_connection_age_ms=30), handlers)
    p.request(1, "/s/Hold", b"")
    await started
    await until(lambda: goaways(p))
    assert p.frames and p.frames[-1][0] == h2.PING and p.frames[-1][3] == GOAWAY_PING
    assert goaways(p) == [(INT_MAX, h2.NO_ERROR, b"")]
    p.request(3, "/s/Echo", b"in flight")
    await p.settle()
    assert p.of(3, h2.HEADERS)[-1][3]["grpc-status"] == "0"
    p.send(ping(GOAWAY_PING, ack=True))
    assert goaways(p)[1:] == [(3, h2.NO_ERROR, b"")] and not p.transport.closed
    p.request(5, "/s/Echo", b"late")
    await p.settle()
    assert struct.unpack(">I", p.of(5, h2.RST_STREAM)[0][3])[0] == h2.REFUSED_STREAM
    release.set()
    await until(lambda: p.transport.closed)
    assert p.body(1).endswith(b"done")


@run
async def test_max_connection_age_grace_cuts_off_calls_still_running():
    handlers, started, _ = blocking_handlers()
    p = peer(KeepaliveSettings(max_connection_age_ms=20, max_connection_age_grace_ms=500),
             handlers)
    p.request(1, "/s/Hold", b"")
    await started
    await until(lambda: goaways(p))
    p.send(ping(GOAWAY_PING, ack=True))
    assert not p.transport.closed  # the call runs on
    await until(lambda: p.transport.closed)
    assert not p.of(1, h2.HEADERS)  # it never answered


@run
async def test_timers_go_with_the_connection():
    """A closed connection leaves no timer behind (each would hold it for hours)."""
    p = peer(KeepaliveSettings(keepalive_time_ms=60_000, max_connection_age_ms=60_000,
                               keepalive_permit_without_calls=True))
    policy = p.conn.policy
    timers = [policy.keepalive_timer, policy.age_timer]
    assert all(t is not None and not t.cancelled() for t in timers)
    p.conn.connection_lost(None)
    assert all(t.cancelled() for t in timers)
    assert policy.keepalive_timer is None and policy.age_timer is None
    assert peer(None).conn.policy is None  # no settings: no policy, no per-frame work


def test_grpcio_options_are_the_channel_arguments_triton_passes():
    opts = dict(KeepaliveSettings(keepalive_time_ms=1000, max_connection_age_ms=5)
                .grpcio_options())
    assert opts["grpc.keepalive_time_ms"] == 1000
    assert opts["grpc.http2.max_ping_strikes"] == 2
    assert opts["grpc.http2.min_recv_ping_interval_without_data_ms"] == 300_000
    assert opts["grpc.max_connection_age_ms"] == 5
    assert "grpc.max_connection_age_grace_ms" not in opts  # 0: left to grpc-core
