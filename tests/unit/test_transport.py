"""shm/transport.py's MemoryHub keeps the sockets' delivery rules that loops rely on."""

import asyncio

from shm.messages.frontend import CancelRequest, FrontendReady
from shm.messages.worker import BatchDone
from shm.transport import SOCKETS, MemoryHub


def test_what_one_pass_sends_arrives_as_one_burst_decoded_by_the_inbox_types():
    async def body():
        loop = asyncio.get_running_loop()
        hub = MemoryHub()
        got, bursts = [], []
        inbox = hub.inbox("a", (CancelRequest, FrontendReady))
        inbox.attach(loop, got.append, lambda: bursts.append(len(got)))
        out = hub.outbox(loop)
        out.send("a", CancelRequest(1, "x"))
        out.send_many([("a", FrontendReady(0, "f", 7)), ("a", CancelRequest(2, "x"))])
        out.send("a", BatchDone(3, "i"))  # not a type this inbox takes: dropped
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got == [CancelRequest(1, "x"), FrontendReady(0, "f", 7), CancelRequest(2, "x")]
        assert bursts == [3]
    asyncio.run(body())


def test_cork_holds_frames_until_uncork():
    async def body():
        loop = asyncio.get_running_loop()
        hub = MemoryHub()
        got = []
        hub.inbox("a", (CancelRequest,)).attach(loop, got.append)
        out = hub.outbox(loop)
        out.cork()
        out.send("a", CancelRequest(1, "x"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == []
        out.uncork()
        await asyncio.sleep(0)
        assert got == [CancelRequest(1, "x")]
    asyncio.run(body())


def test_an_unwatched_pausable_inbox_keeps_frames_for_drain_or_watch():
    async def body():
        loop = asyncio.get_running_loop()
        hub = MemoryHub()
        got = []
        inbox = hub.inbox("d", (BatchDone,))
        inbox.attach(loop, got.append, pausable=True)
        inbox.watch(False)
        out = hub.outbox(loop)
        out.send("d", BatchDone(1, "i"))
        out.send("d", BatchDone(2, "i"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == []
        inbox.drain()
        assert [m.batch_id for m in got] == [1, 2]
        out.send("d", BatchDone(3, "i"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(got) == 2
        inbox.watch(True)  # level-triggered: what waits wakes the loop
        await asyncio.sleep(0)
        assert [m.batch_id for m in got] == [1, 2, 3]
    asyncio.run(body())


def test_a_loop_sends_to_a_peer_not_listening_yet_and_a_thread_is_told_it_is_gone():
    async def body():
        loop = asyncio.get_running_loop()
        hub = MemoryHub()
        assert hub.outbox(loop).send("late", CancelRequest(1, "x"))
        await asyncio.sleep(0)
        assert not hub.outbox().send("nobody", CancelRequest(2, "x"))
        got = []
        hub.inbox("late", (CancelRequest,)).attach(loop, got.append)
        await asyncio.sleep(0)
        assert got == [CancelRequest(1, "x")]
    asyncio.run(body())


def test_a_thread_receives_with_a_timeout():
    hub = MemoryHub()
    inbox = hub.inbox("w", (CancelRequest,))
    assert inbox.recv(timeout_ms=1) is None
    hub.outbox().send("w", CancelRequest(5, "x"))
    assert inbox.recv(timeout_ms=1000) == CancelRequest(5, "x")


def test_the_socket_transport_is_shm_channel():
    from shm import channel
    assert SOCKETS.inbox is channel.Inbox and SOCKETS.outbox is channel.Outbox
