"""shm.channel: frames over Unix sockets, blocking (worker threads) and on a loop."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import msgspec
import pytest

from shm.channel import EARLY_FLUSH, Inbox, Outbox, encode, ipc_address


class Ping(msgspec.Struct, tag=True):
    n: int
    blob: bytes = b""


class Pong(msgspec.Struct, tag=True):
    n: int


@pytest.fixture
def address(tmp_path):
    return ipc_address(str(tmp_path), "inbox")


def test_blocking_send_and_recv_keep_order_across_sizes(address):
    inbox = Inbox(address, [Ping, Pong])
    out = Outbox()
    # small frames, one larger than a whole read (it arrives in pieces), then small again
    sizes = [0, 10, 70_000, 3 << 20, 5, 1 << 20, 0]
    sent = [Ping(i, os.urandom(size)) for i, size in enumerate(sizes)] + [Pong(99)]

    def send_all():
        for msg in sent:
            assert out.send(address, msg)

    t = threading.Thread(target=send_all)
    t.start()
    got = [inbox.recv(timeout_ms=10_000) for _ in sent]
    t.join()
    assert got == sent
    assert inbox.recv(timeout_ms=50) is None  # nothing more, and the timeout holds
    out.close()
    inbox.close()
    assert not os.path.exists(address[len("ipc://"):])


def test_messages_from_several_peers_all_arrive(address):
    inbox = Inbox(address, [Ping])

    def peer(k):
        out = Outbox()
        for i in range(200):
            out.send(address, Ping(k * 1000 + i))
        out.close()

    threads = [threading.Thread(target=peer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    got = [inbox.recv(timeout_ms=10_000).n for _ in range(800)]
    for t in threads:
        t.join()
    assert sorted(got) == sorted(k * 1000 + i for k in range(4) for i in range(200))
    for k in range(4):  # each peer's own messages stay in order
        mine = [n for n in got if n // 1000 == k]
        assert mine == sorted(mine)
    inbox.close()


def test_a_malformed_frame_is_dropped_and_the_next_one_delivered(address):
    inbox = Inbox(address, [Ping])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address[len("ipc://"):])
    bad = encode(Pong(1))  # a type this inbox does not take
    good = encode(Ping(2))
    sock.sendall(len(bad).to_bytes(4, "little") + bad + len(good).to_bytes(4, "little")
                 + good)
    assert inbox.recv(timeout_ms=5_000) == Ping(2)
    sock.close()
    inbox.close()


def test_a_thread_sending_to_nobody_is_told_the_peer_is_gone(tmp_path):
    out = Outbox()
    assert out.send(ipc_address(str(tmp_path), "nobody"), Ping(1)) is False


def test_a_peer_gone_is_a_warning_while_running_and_info_while_stopping(tmp_path, caplog):
    """Rule (issue 26, 7): a peer gone while the process runs is a fault (a warning);
    once the process stops, its peers stop too, and the same drop is logged at info,
    so a clean stop writes no warning."""
    out = Outbox()
    caplog.set_level("INFO", logger="shmserve.channel")
    assert out.send(ipc_address(str(tmp_path), "a"), Ping(1)) is False
    out.stopping = True
    assert out.send(ipc_address(str(tmp_path), "b"), Ping(2)) is False
    gone = [(r.levelname, r.getMessage()) for r in caplog.records
            if "is gone" in r.getMessage()]
    assert [level for level, _ in gone] == ["WARNING", "INFO"], gone
    assert gone[0][1].endswith("/a is gone; dropped Ping")


def test_loop_sends_wait_for_a_peer_that_starts_later_and_keep_order(address):
    """A child's inbox may not exist yet when its parent first writes to it."""
    got: list = []

    async def main():
        loop = asyncio.get_running_loop()
        out = Outbox(loop)
        for i in range(50):
            assert out.send(address, Ping(i))  # queued: nobody listens yet
        await asyncio.sleep(0.1)
        inbox = Inbox(address, [Ping])
        done = loop.create_future()

        def handle(msg):
            got.append(msg.n)
            if len(got) == 60 and not done.done():
                done.set_result(None)

        inbox.attach(loop, handle)
        for i in range(50, 60):
            out.send(address, Ping(i))
        await asyncio.wait_for(done, 10)
        out.close()
        inbox.close()

    asyncio.run(main())
    assert got == list(range(60))


def test_loop_sends_more_than_the_socket_holds_without_blocking(address):
    """A peer that does not read yet: the loop goes on, and every frame arrives later."""
    inbox = Inbox(address, [Ping])
    blob = bytes(256 << 10)

    async def main():
        out = Outbox(asyncio.get_running_loop())
        for i in range(64):  # 16 MiB: far more than a socket buffer
            out.send(address, Ping(i, blob))
        await asyncio.sleep(0)  # the loop runs (and does not block) while nobody reads
        return out

    loop = asyncio.new_event_loop()
    out = loop.run_until_complete(main())
    received = []
    reader = threading.Thread(
        target=lambda: received.extend(inbox.recv(timeout_ms=10_000).n for _ in range(64)))
    reader.start()
    while reader.is_alive():  # the loop writes the rest as the reader makes room
        loop.run_until_complete(asyncio.sleep(0.01))
    reader.join()
    assert received == list(range(64))
    out.close()
    loop.close()
    inbox.close()


def test_a_burst_goes_out_every_early_flush_frames_not_at_the_end_of_the_pass(address):
    """A loop's frames to a peer wait for the end of its pass, except in a burst: every
    EARLY_FLUSH frames are written at once, so the peer starts on them while the
    sender is still making the rest."""
    inbox = Inbox(address, [Ping])

    async def main():
        out = Outbox(asyncio.get_running_loop())
        for i in range(EARLY_FLUSH - 1):
            assert out.send(address, Ping(i))
        # (no await: still the same pass) nothing is written yet
        assert inbox.recv(timeout_ms=20) is None
        assert out.send(address, Ping(EARLY_FLUSH - 1))
        # the burst's first EARLY_FLUSH are in the peer's socket before the pass ends
        assert [inbox.recv(timeout_ms=5_000).n for _ in range(EARLY_FLUSH)] == \
            list(range(EARLY_FLUSH))
        out.send(address, Ping(100))  # the next frames wait for the pass's end again
        assert inbox.recv(timeout_ms=20) is None
        await asyncio.sleep(0)
        assert inbox.recv(timeout_ms=5_000) == Ping(100)
        out.close()

    asyncio.run(main())
    inbox.close()


def test_close_writes_out_what_is_still_queued(address):
    """A frontend's last message goes out even though its loop ends right after."""
    inbox = Inbox(address, [Ping])

    async def main():
        out = Outbox(asyncio.get_running_loop())
        out.send(address, Ping(1))
        out.send(address, Ping(2))
        out.close()  # before the loop had a pass to write them

    asyncio.run(main())
    assert [inbox.recv(timeout_ms=5_000).n for _ in range(2)] == [1, 2]
    inbox.close()


def test_a_closed_connection_is_forgotten_and_others_go_on(address):
    inbox = Inbox(address, [Ping])
    first, second = Outbox(), Outbox()
    first.send(address, Ping(1))
    assert inbox.recv(timeout_ms=5_000) == Ping(1)
    first.close()
    second.send(address, Ping(2))
    assert inbox.recv(timeout_ms=5_000) == Ping(2)
    assert inbox.recv(timeout_ms=100) is None
    assert len(inbox._conns) == 1  # the closed one was dropped
    second.close()
    inbox.close()


def test_send_many_keeps_each_peers_order(tmp_path):
    """A batch's responses to several frontends, then its BatchDone to the scheduler."""
    a, b = ipc_address(str(tmp_path), "a"), ipc_address(str(tmp_path), "b")
    inbox_a, inbox_b = Inbox(a, [Ping, Pong]), Inbox(b, [Ping, Pong])
    sent = [(a, Ping(1)), (b, Ping(2)), (a, Ping(3)), (b, Pong(4))]

    Outbox().send_many(sent)  # a worker thread's, blocking

    async def on_loop():
        out = Outbox(asyncio.get_running_loop())
        out.send_many(sent)
        await asyncio.sleep(0.05)
        out.close()

    asyncio.run(on_loop())
    for inbox, address in ((inbox_a, a), (inbox_b, b)):
        mine = [m for to, m in sent if to == address]
        assert [inbox.recv(timeout_ms=5_000) for _ in range(2 * len(mine))] == mine * 2
        inbox.close()


def test_a_thread_sending_to_a_peer_that_stopped_reading_gives_up(address, monkeypatch):
    """The blocking send is timed out by the kernel (SO_SNDTIMEO): a peer that never
    reads is given up after the timeout, not waited on for ever."""
    import time

    import shm.channel as channel
    monkeypatch.setattr(channel, "_BLOCKING_SEND_TIMEOUT", 0.2)
    inbox = Inbox(address, [Ping])
    out = Outbox()
    try:
        start = time.monotonic()
        sent = 0
        while out.send(address, Ping(sent, bytes(1 << 16))):
            sent += 1
            assert time.monotonic() - start < 10
        assert sent > 0
        assert time.monotonic() - start < 5
    finally:
        out.close()
        inbox.close()


def test_unwatched_inbox_holds_messages_until_drained_or_watched(tmp_path):
    """The scheduler's quiet inbox: unwatched, a message does not wake the loop; it is
    read by drain(), or by the loop as soon as the inbox is watched again."""
    quiet_address = ipc_address(str(tmp_path), "quiet")
    loud_address = ipc_address(str(tmp_path), "loud")
    got: list = []

    async def main():
        loop = asyncio.get_running_loop()
        quiet, loud = Inbox(quiet_address, [Ping]), Inbox(loud_address, [Ping])
        arrived: asyncio.Queue = asyncio.Queue()
        quiet.attach(loop, lambda m: got.append(m.n) or arrived.put_nowait(m.n),
                     pausable=True)
        loud.attach(loop, lambda m: arrived.put_nowait(("loud", m.n)))
        sender, late = Outbox(), Outbox()  # blocking: sent once in the kernel's buffer

        async def send(out, address, n):
            assert await asyncio.to_thread(out.send, address, Ping(n))

        await send(sender, quiet_address, 1)
        assert await asyncio.wait_for(arrived.get(), 10) == 1  # watched: delivered
        quiet.watch(False)
        await send(sender, quiet_address, 2)
        await send(late, quiet_address, 3)  # a connection made while unwatched
        # a message sent after them to a watched inbox comes through the loop; the
        # quiet ones, readable since before it, would have come in the same pass
        await send(sender, loud_address, 0)
        assert await asyncio.wait_for(arrived.get(), 10) == ("loud", 0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == [1]
        quiet.drain()
        assert sorted(got) == [1, 2, 3]
        await send(late, quiet_address, 4)
        quiet.watch(True)  # what waits already wakes the loop
        while (n := await asyncio.wait_for(arrived.get(), 10)) != 4:
            pass
        sender.close()
        late.close()
        quiet.close()
        loud.close()

    asyncio.run(main())
    assert sorted(got) == [1, 2, 3, 4]


def test_a_handler_table_gets_each_message_by_its_type(address):
    """attach() with {type: handler}: each message goes to its type's handler, and one
    that raises loses its own message only."""
    got: list = []

    async def main():
        loop = asyncio.get_running_loop()
        inbox = Inbox(address, [Ping, Pong])
        done = loop.create_future()

        def on_ping(msg):
            if msg.n == 1:
                raise RuntimeError("a bug in a handler")
            got.append(("ping", msg.n))

        def on_pong(msg):
            got.append(("pong", msg.n))
            if msg.n == 3:
                done.set_result(None)

        inbox.attach(loop, {Ping: on_ping, Pong: on_pong})
        out = Outbox(loop)
        for msg in (Ping(0), Ping(1), Pong(2), Ping(2), Pong(3)):
            out.send(address, msg)
        await asyncio.wait_for(done, 10)
        out.close()
        inbox.close()

    asyncio.run(main())
    assert got == [("ping", 0), ("pong", 2), ("ping", 2), ("pong", 3)]
