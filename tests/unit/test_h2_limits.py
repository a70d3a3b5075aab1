"""The limits transport/h2.py holds a hostile peer to (transport/h2_limits.py), each at
small values, in process: the attack reaches the limit, the attacking connection ends
with the code the limit names, and another connection of the same server is served
meanwhile. Time is given to tick() by the test, so nothing here waits for a clock.
"""

from __future__ import annotations

import asyncio
import struct

import grpc
import pytest

from frontend.transport import h2
from frontend.transport.grpc_native import NativeGrpcServer
from frontend.transport.h2_limits import HeldBudget, Limits, TokenBucket
from tests.unit.test_h2 import Peer, _echo_handlers, run

pytestmark = pytest.mark.timeout(30)

U32 = struct.Struct(">I")


def goaway_code(p: Peer):
    goaways = [f for f in p.read() if f[0] == h2.GOAWAY]
    return U32.unpack(goaways[-1][3][4:8])[0] if goaways else None


def rst_codes(p: Peer, sid: int):
    return [U32.unpack(f[3])[0] for f in p.of(sid, h2.RST_STREAM)]


def status(p: Peer, sid: int):
    heads = p.of(sid, h2.HEADERS)
    return heads[-1][3].get("grpc-status") if heads else None


def server_of(p: Peer):
    return p.conn.server


async def victim_served(victim: Peer, sid: int) -> None:
    """The other connection: one Echo, answered OK."""
    victim.request(sid, "/s/Echo", b"ok")
    await victim.settle()
    assert status(victim, sid) == "0" and victim.body(sid).endswith(b"ok")


def test_token_bucket_refills_at_its_rate_up_to_its_burst():
    b = TokenBucket(3, 2.0, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.5) and not b.take(0.5)  # one token back after half a second
    assert b.take(100.0, 3) and not b.take(100.0)  # never more than the burst


def test_limits_take_only_known_names():
    assert Limits(max_streams=7).max_streams == 7 and Limits().max_streams == 250
    with pytest.raises(TypeError):
        Limits(max_stream=7)


# -- rapid reset ------------------------------------------------------------------------

@run
async def test_rapid_reset_ends_the_connection_with_enhance_your_calm():
    started = []

    async def work(request, context):
        started.append(context)
        await asyncio.sleep(3600)

    handlers = _echo_handlers()
    handlers["/s/Chat"] = grpc.stream_stream_rpc_method_handler(work)
    limits = Limits(reset_burst=20, reset_rate=0.001)
    attacker = Peer(handlers, limits=limits)
    victim = Peer(handlers, limits=limits, server=server_of(attacker))
    sid = 1
    while not attacker.transport.closed and sid < 200:
        block = attacker.headers_block("/s/Chat")
        attacker.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, block)
                      + h2.frame(h2.RST_STREAM, 0, sid, U32.pack(h2.CANCEL)))
        await victim_served(victim, sid)
        sid += 2
    assert goaway_code(attacker) == h2.ENHANCE_YOUR_CALM
    assert sid // 2 == 21  # the burst, then the one that found the bucket empty
    await attacker.settle()
    assert all(c.cancelled() for c in started) and attacker.conn.lingering == 0
    assert not victim.transport.closed


@run
async def test_completed_calls_give_reset_tokens_back():
    """h2o's rule: only a peer whose resets outrun its completed calls runs dry."""
    p = Peer(_echo_handlers(), limits=Limits(reset_burst=5, reset_rate=0.001))
    for i in range(40):
        sid = 1 + 4 * i
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, p.headers_block("/s/Echo"))
               + h2.frame(h2.RST_STREAM, 0, sid, U32.pack(h2.CANCEL)))
        p.request(sid + 2, "/s/Echo", b"x")
        await p.settle()
    assert not p.transport.closed and goaway_code(p) is None


@run
async def test_handlers_still_running_after_their_reset_count_against_max_streams():
    """Go's rule: a reset stream whose handler has not ended still takes a slot, so
    resets cannot pile up handlers past MAX_CONCURRENT_STREAMS."""
    release = asyncio.Event()

    async def stubborn(requests, context):
        while True:
            try:
                await release.wait()
                return
            except asyncio.CancelledError:
                if release.is_set():
                    return  # only now does it let go

    handlers = _echo_handlers()
    handlers["/s/Chat"] = grpc.stream_stream_rpc_method_handler(stubborn)
    p = Peer(handlers, limits=Limits(max_streams=2))
    for sid in (1, 3):
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, p.headers_block("/s/Chat")))
        await p.settle()  # the handler runs
        p.send(h2.frame(h2.RST_STREAM, 0, sid, U32.pack(h2.CANCEL)))
    await p.settle()
    assert p.conn.streams == {} and p.conn.lingering == 2
    p.request(5, "/s/Echo", b"x")
    await p.settle()
    assert rst_codes(p, 5) == [h2.REFUSED_STREAM]
    release.set()
    await p.settle()
    assert p.conn.lingering == 0
    p.request(7, "/s/Echo", b"x")
    await p.settle()
    assert status(p, 7) == "0"


# -- one read's work --------------------------------------------------------------------

@run
async def test_one_read_opens_a_bounded_number_of_streams_then_yields():
    a = Peer(_echo_handlers(), limits=Limits(streams_per_read=4, frames_per_read=64))
    b = Peer(_echo_handlers(), limits=a.conn.limits, server=server_of(a))
    burst = b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid,
                              a.headers_block("/s/Echo")) for sid in range(1, 41, 2))
    a.send(burst)
    assert a.conn.last_stream == 7 and not a.transport.reading  # 4 streams, then wait
    order = []
    b.request(1, "/s/Echo", b"x")  # the other connection's work goes in between
    asyncio.get_running_loop().call_soon(lambda: order.append(a.conn.last_stream))
    await a.settle()
    await a.settle()
    assert order and order[0] < 39
    assert a.conn.last_stream == 39 and a.transport.reading
    assert all(a.of(sid, h2.HEADERS) for sid in range(1, 41, 2))
    assert status(b, 1) == "0"


@run
async def test_one_read_handles_a_bounded_number_of_frames_then_yields():
    p = Peer(_echo_handlers(), limits=Limits(frames_per_read=8))
    acks = len([f for f in p.read() if f[0] == h2.PING])
    p.send(h2.frame(h2.PING, 0, 0, b"12345678") * 100)
    assert len([f for f in p.read() if f[0] == h2.PING]) == acks + 8
    assert not p.transport.reading
    for _ in range(30):
        await asyncio.sleep(0)
    assert len([f for f in p.read() if f[0] == h2.PING]) == acks + 100
    assert p.transport.reading and not p.conn.buf


# -- header lists -------------------------------------------------------------------------

@run
async def test_a_header_list_past_the_cap_gets_resource_exhausted_and_the_table_holds():
    p = Peer(_echo_handlers(), limits=Limits(max_header_list=1024))
    big = [("x-big", "v" * 2000)]
    p.request(1, "/s/Echo", b"x", extra=big)  # indexes x-big in both tables
    await p.settle()
    (head,) = p.of(1, h2.HEADERS)
    assert head[1] & h2.END_STREAM and head[3]["grpc-status"] == "8"
    assert head[3]["grpc-message"].startswith(
        "received metadata size exceeds hard limit (")
    assert head[3]["grpc-message"].endswith(" vs. 1024)")
    p.request(3, "/s/Echo", b"y")  # indexed fields only now: the tables agree
    await p.settle()
    assert status(p, 3) == "0" and not p.transport.closed


@run
async def test_hpack_amplification_ends_the_connection_at_the_second_block():
    """One 4 KB entry referenced 4,000 times in a 4,000-byte block is a 16 MB header
    list: refused without building it; it costs ~1,000 reset tokens, and the next one
    finds the bucket empty."""
    p = Peer(_echo_handlers())
    victim = Peer(_echo_handlers(), server=server_of(p))
    request = b"".join(h2.literal(n, v) for n, v in (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/s/Echo"),
        (b"te", b"trailers")))
    big = b"\x40" + h2.hpack_int(5, 7) + b"x-big" + h2.hpack_int(4000, 7) + b"v" * 4000
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, request + big)
           + h2.frame(h2.DATA, h2.END_STREAM, 1, b"\0\0\0\0\x01x"))
    await p.settle()
    assert status(p, 1) == "0"  # x-big is entry 62 now
    amplified = request + b"\xbe" * 4000
    for sid in (3, 5):
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, amplified))
        await victim_served(victim, sid)
    assert p.of(3, h2.HEADERS)[0][3]["grpc-status"] == "8"
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM and p.transport.closed


@pytest.mark.parametrize("limits, frames", [
    (Limits(max_header_block=4096), [(0, b"\0" * 3000), (0, b"\0" * 3000)]),
    (Limits(max_continuations=2), [(0, b""), (0, b""), (0, b""), (h2.END_HEADERS, b"")]),
])
@run
async def test_header_blocks_too_large_or_in_too_many_pieces_end_the_connection(
        limits, frames):
    p = Peer(_echo_handlers(), limits=limits)
    p.send(h2.frame(h2.HEADERS, 0, 1, p.headers_block("/s/Echo")))
    for flags, payload in frames:
        p.send(h2.frame(h2.CONTINUATION, flags, 1, payload))
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM and p.transport.closed


# -- control frames ---------------------------------------------------------------------

@pytest.mark.parametrize("flood", [
    h2.frame(h2.PING, 0, 0, b"12345678"),
    h2.frame(h2.SETTINGS, 0, 0, b""),
    h2.frame(h2.PRIORITY_FRAME, 0, 1, b"\0\0\0\0\x10"),
    h2.frame(0x20, 0, 0, b"unknown"),
])  # WINDOW_UPDATEs are no glitch, however small (the test below)
@run
async def test_a_flood_of_frames_that_do_nothing_ends_with_enhance_your_calm(flood):
    p = Peer(_echo_handlers(), limits=Limits(glitch_burst=100, glitch_rate=0.001))
    victim = Peer(_echo_handlers(), server=server_of(p))
    p.send(flood * 100)
    assert not p.transport.closed
    await victim_served(victim, 1)
    p.send(flood)
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM and p.transport.closed


@run
async def test_a_connection_whose_output_piles_up_stops_being_read_until_it_drains():
    limits = Limits(read_pause_high=100_000, output_stall=30.0)
    p = Peer(_echo_handlers(), limits=limits)
    victim = Peer(_echo_handlers(), server=server_of(p))
    p.transport.stuck = True  # the peer reads nothing from here on
    ping = h2.frame(h2.PING, 0, 0, b"12345678")
    while p.transport.reading:
        p.send(ping * 100)
    backlog = p.transport.unsent
    assert 100_000 < backlog < 100_000 + 1700 * 2  # stopped right past the mark
    acks = len([f for f in p.read() if f[0] == h2.PING])
    p.send(ping * 1000)  # what a paused transport still hands over: kept, not answered
    await p.settle()
    assert p.transport.unsent == backlog and len(p.conn.buf) == 17 * 1000
    await victim_served(victim, 1)
    p.transport.drain()  # the peer reads again
    await p.settle()
    assert p.transport.reading and not p.conn.buf
    assert len([f for f in p.read() if f[0] == h2.PING]) == acks + 1000


@run
async def test_a_connection_stuck_past_the_mark_is_aborted_after_the_stall_time():
    p = Peer(_echo_handlers(), limits=Limits(read_pause_high=10_000, output_stall=5.0))
    p.transport.stuck = True
    while p.transport.reading:
        p.send(h2.frame(h2.PING, 0, 0, b"12345678") * 100)
    now = asyncio.get_running_loop().time()
    p.conn.tick(now + 4)
    assert not p.transport.aborted
    p.transport.unsent -= 1000  # the peer took a little: progress, the clock restarts
    p.conn.tick(now + 8)
    p.conn.tick(now + 12)
    assert not p.transport.aborted
    p.conn.tick(now + 14)
    assert p.transport.aborted


# -- bytes held for closed windows --------------------------------------------------------

def _big_handlers():
    handlers = _echo_handlers()

    async def chunks(request, context):  # a streaming reply of 10 kB messages
        for _ in range(int(request)):
            await context.write(b"z" * 10_000)

    handlers["/s/Chunks"] = grpc.unary_stream_rpc_method_handler(chunks)
    return handlers


@run
async def test_a_zero_window_peer_holds_a_bounded_amount_and_then_is_refused():
    budget = HeldBudget(1 << 30)
    limits = Limits(conn_held_max=50_000, reset_burst=10, reset_rate=0.001)
    p = Peer(_big_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0),
             limits=limits, budget=budget)
    victim = Peer(_big_handlers(), limits=limits, budget=budget, server=server_of(p))
    sid = 1
    while p.conn.held < 50_000:
        p.request(sid, "/s/Big", b"20000")
        await p.settle()
        sid += 2
    held = p.conn.held
    assert held == budget.held and held < 50_000 + 20_005
    p.request(sid, "/s/Big", b"20000")
    await p.settle()
    assert rst_codes(p, sid) == [h2.REFUSED_STREAM] and p.conn.held == held
    await victim_served(victim, 1)
    while not p.transport.closed:  # refusals cost reset tokens
        sid += 2
        p.request(sid, "/s/Big", b"20000")
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM
    p.conn.connection_lost(None)  # what it held goes with it
    assert p.conn.held == 0 and budget.held == 0


@run
async def test_the_process_budget_refuses_connections_that_hold_not_others():
    budget = HeldBudget(30_000)
    zero = struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0)
    a = Peer(_big_handlers(), zero, budget=budget)
    b = Peer(_big_handlers(), zero, budget=budget, server=server_of(a))
    clean = Peer(_big_handlers(), budget=budget, server=server_of(a))
    a.request(1, "/s/Big", b"20000")
    b.request(1, "/s/Big", b"20000")
    await a.settle()
    assert budget.held == a.conn.held + b.conn.held == 40_010 and budget.over()
    for p in (a, b):
        p.request(3, "/s/Big", b"10")
        await p.settle()
        assert rst_codes(p, 3) == [h2.REFUSED_STREAM]
    await victim_served(clean, 1)  # holding nothing, it is served
    a.send(h2.frame(h2.RST_STREAM, 0, 1, U32.pack(h2.CANCEL)))
    assert budget.held == b.conn.held and not budget.over()
    b.request(5, "/s/Big", b"10")
    await b.settle()
    assert not rst_codes(b, 5)


@run
async def test_a_peer_that_keeps_its_windows_shut_gets_goaway_after_the_stall_time():
    p = Peer(_big_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0),
             limits=Limits(conn_held_max=10_000, held_stall=5.0), budget=HeldBudget())
    p.request(1, "/s/Big", b"20000")
    await p.settle()
    now = asyncio.get_running_loop().time()
    p.conn.tick(now)
    p.conn.tick(now + 4)
    assert not p.transport.closed
    p.conn.tick(now + 6)
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM and p.transport.closed


@run
async def test_streaming_writers_wait_while_the_connection_holds_too_much():
    p = Peer(_big_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0),
             limits=Limits(conn_held_max=45_000), budget=HeldBudget())
    p.request(1, "/s/Chunks", b"100")
    await p.settle()
    assert 45_000 <= p.conn.held < 60_000  # the handler waits: no unbounded backlog
    p.send(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.INITIAL_WINDOW_SIZE,
                                                     1 << 30))
           + h2.frame(h2.WINDOW_UPDATE, 0, 0, U32.pack(1 << 30)))
    for _ in range(50):
        await p.settle()
    assert p.conn.held == 0 and status(p, 1) == "0"
    assert len(p.body(1)) == 100 * 10_005


# -- time limits ----------------------------------------------------------------------------

@run
async def test_no_preface_or_no_settings_in_time_ends_the_connection():
    for sent in (b"", h2.PREFACE):
        p = Peer(_echo_handlers(), preface=False)
        p.send(sent)
        now = asyncio.get_running_loop().time()
        p.conn.tick(now + 9)
        assert not p.transport.closed
        p.conn.tick(now + 11)
        assert goaway_code(p) == h2.SETTINGS_TIMEOUT and p.transport.closed


@run
async def test_a_header_block_not_finished_in_time_ends_the_connection():
    p = Peer(_echo_handlers())
    p.send(h2.frame(h2.HEADERS, 0, 1, p.headers_block("/s/Echo")[:4]))
    now = asyncio.get_running_loop().time()
    p.conn.tick(now + 9)
    assert not p.transport.closed
    p.conn.tick(now + 11)
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM and p.transport.closed


@run
async def test_a_connection_idle_for_the_idle_timeout_gets_goaway_no_error():
    started = asyncio.get_running_loop().create_future()
    p = Peer(_echo_handlers(started), limits=Limits(idle_timeout=60.0))
    now = asyncio.get_running_loop().time()
    p.request(1, "/s/Slow", b"")  # a call running for long is not idleness
    await started
    for t in (0, 50, 100, 200):
        p.conn.tick(now + t)
    assert not p.transport.closed
    p.send(h2.frame(h2.RST_STREAM, 0, 1, U32.pack(h2.CANCEL)))
    await p.settle()
    p.conn.tick(now + 201)
    p.request(3, "/s/Echo", b"x")  # a call is activity
    await p.settle()
    p.conn.tick(now + 250)
    p.conn.tick(now + 309)
    assert not p.transport.closed
    p.conn.tick(now + 311)
    assert goaway_code(p) == h2.NO_ERROR and p.transport.closed


@run
async def test_after_a_connection_error_a_peer_that_reads_nothing_is_aborted():
    p = Peer(_echo_handlers(), limits=Limits(close_grace=0.05))
    p.send(h2.frame(h2.PING, 0, 1, b"12345678"))  # a connection error
    assert p.transport.closed and not p.transport.aborted  # closing, output unsent
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not p.transport.aborted and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert p.transport.aborted


# -- connections ----------------------------------------------------------------------------

@run
async def test_connections_past_the_maximum_are_told_and_closed():
    first = Peer(_echo_handlers(), limits=Limits(max_connections=2))
    server = server_of(first)
    second = Peer(_echo_handlers(), limits=first.conn.limits, server=server)
    third = Peer(_echo_handlers(), limits=first.conn.limits, server=server)
    assert goaway_code(third) == h2.ENHANCE_YOUR_CALM and third.transport.closed
    assert b"too many connections" in [f for f in third.frames if f[0] == h2.GOAWAY][0][3]
    assert server.connections == {first.conn, second.conn}
    await victim_served(second, 1)
    first.conn.connection_lost(None)
    fourth = Peer(_echo_handlers(), limits=first.conn.limits, server=server)
    await victim_served(fourth, 1)


@run
async def test_the_server_ticks_its_connections():
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = NativeGrpcServer(_echo_handlers(), sock, limits=Limits(handshake_timeout=0.2))
    server.TICK = 0.05
    await server.start()
    reader, writer = await asyncio.open_connection(*sock.getsockname())
    data = await asyncio.wait_for(reader.read(), 5)  # the server closes it
    assert h2.frame(h2.GOAWAY, 0, 0)[3:4] in data[:300] and b"preface" in data
    writer.close()
    await server.stop(0)


@run
async def test_small_window_updates_as_grpc_clients_send_them_are_no_glitch():
    # grpc-core gives back what it reads in small connection-level updates (and for
    # streams that just ended): thousands a second at 12k calls/s, all legitimate
    p = Peer(_echo_handlers(), limits=Limits(glitch_burst=10, glitch_rate=0.001))
    for sid in range(1, 201, 2):
        p.request(sid, "/s/Echo", b"x" * 10)
        await p.settle()
        p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 100))
               + h2.frame(h2.WINDOW_UPDATE, 0, sid, struct.pack(">I", 15)))
    await p.settle()
    assert not p.transport.closed
    assert not [f for f in p.read() if f[0] == h2.GOAWAY]
    assert p.body(199) == b"\x00\x00\x00\x00\x0a" + b"x" * 10


@run
async def test_the_heap_is_trimmed_after_a_connection_that_held_much_for_its_peer(
        monkeypatch):
    # the replies a window-starving peer made us hold were freed into a heap that keeps
    # up to 256 MiB for reuse: when such a connection ends, that share goes back
    trims = []
    monkeypatch.setattr(h2, "release_freed_heap", lambda: trims.append(1))
    monkeypatch.setattr(h2, "HEAP_TRIM_HELD", 30_000)
    zero = struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0)
    small, starving = (Peer(_big_handlers(), zero) for _ in range(2))
    small.request(1, "/s/Big", b"10000")
    starving.request(1, "/s/Big", b"20000")
    starving.request(3, "/s/Big", b"20000")
    await small.settle()
    assert small.conn.held_peak < 30_000 <= starving.conn.held_peak
    small.conn.connection_lost(None)
    await small.settle()
    assert not trims  # what normal traffic holds stays for reuse
    starving.conn.connection_lost(None)
    await starving.settle()
    assert trims == [1]


@run
async def test_streams_refused_for_shut_windows_cost_more_reset_tokens():
    # the peer sends each request's body before it learns of the refusal: one that
    # keeps its windows shut and opening streams is ended after a tenth of the resets
    limits = Limits(conn_held_max=20_000, reset_burst=100, reset_rate=0.001,
                    held_refusal_cost=10)
    p = Peer(_big_handlers(), struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0),
             limits=limits)
    p.request(1, "/s/Big", b"20000")
    await p.settle()
    sid, refused = 3, 0
    while not p.transport.closed:
        p.request(sid, "/s/Big", b"20000")
        refused += 1
        sid += 2
    assert goaway_code(p) == h2.ENHANCE_YOUR_CALM
    assert 9 <= refused <= 11  # 100 tokens at 10 a refusal (1 each: 100)


@run
async def test_a_window_update_flood_is_read_a_bounded_batch_at_a_time_and_costs_nothing():
    # WINDOW_UPDATEs are never glitches (grpc-core sends thousands), so what bounds a
    # flood of them is the frame budget of a read: the connection yields to the loop
    # every `frames_per_read` frames, answers nothing, holds nothing, and stays usable
    p = Peer(_echo_handlers(), limits=Limits(frames_per_read=8))
    before = len(p.read())
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 5000)
    assert not p.transport.reading  # paused after 8 frames, the rest waits its turn
    for _ in range(1000):
        if p.transport.reading:
            break
        await asyncio.sleep(0)
    assert p.transport.reading and not p.conn.buf
    assert len(p.read()) == before  # no answer to any of them
    assert not p.transport.closed
    p.request(1, "/s/Echo", b"x" * 10)
    await p.settle()
    assert p.body(1) == b"\x00\x00\x00\x00\x0a" + b"x" * 10


@run
async def test_whole_replies_to_a_peer_that_reads_nothing_stop_its_reading_at_the_mark():
    """Unary replies queued whole (send_whole, from a task-less starter as ModelInfer's)
    to a peer that opened its windows wide and then reads nothing: past
    read_pause_high of unsent output the connection stops reading its calls, so what
    the server holds for it stays near the mark however much it sends, and another
    client is served meanwhile."""
    limits = Limits(read_pause_high=100_000, output_stall=30.0)
    p = Peer(_echo_handlers(), limits=limits,
             settings=struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 1 << 30))
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))
    answered = []

    def starter(message, call, done):  # answers at once, as a cache hit would
        if call.conn is p.conn:
            answered.append(call)
        done(bytes(message))

    server_of(p).starters = {"/s/Echo": starter}
    victim = Peer(_echo_handlers(), server=server_of(p))
    whole = p.conn.send_whole
    p.conn.send_whole = lambda *a: whole(*a) or pytest.fail("not sent whole")
    p.transport.stuck = True  # the peer reads nothing from here on
    sid = 1
    while p.transport.reading:
        assert sid < 2_000, "the connection was never paused"
        p.request(sid, "/s/Echo", b"x" * 1000)
        sid += 2
    backlog = p.transport.unsent
    assert 100_000 < backlog < 100_000 + 2 * 1100  # stopped right past the mark
    calls = len(answered)
    for _ in range(50):  # what a paused transport still hands over: kept, not run
        p.request(sid, "/s/Echo", b"x" * 1000)
        sid += 2
    await p.settle()
    assert len(answered) == calls and p.transport.unsent == backlog
    await victim_served(victim, 1)
    p.transport.drain()  # the peer reads again: the kept calls run and are answered
    await p.settle()
    assert len(answered) == calls + 50
