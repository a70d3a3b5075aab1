"""frontend/stream_slots.py: a connection's slots for stream requests, taken in turn,
and never lost to a reader cancelled while it waits."""

import asyncio

import pytest

from frontend.stream_slots import ConnectionSlots, Slots

pytestmark = pytest.mark.timeout(10)


async def _turns():
    for _ in range(5):
        await asyncio.sleep(0)


def test_slots_go_in_the_order_asked_and_come_back():
    async def main():
        slots = Slots(2)
        await slots.take()
        await slots.take()
        got = []
        waiting = [asyncio.ensure_future(_take(slots, got, k)) for k in range(3)]
        await _turns()
        assert got == [] and slots.used == 2
        slots.give()
        await _turns()
        assert got == [0]
        slots.give()
        slots.give()
        await _turns()
        assert got == [0, 1, 2] and slots.used == 2
        await asyncio.gather(*waiting)
        for _ in range(2):
            slots.give()
        assert slots.used == 0 and not slots.waiters

    asyncio.run(main())


async def _take(slots, got, k):
    await slots.take()
    got.append(k)


def test_a_reader_cancelled_while_waiting_takes_no_slot():
    async def main():
        slots = Slots(1)
        await slots.take()
        cancelled = asyncio.ensure_future(slots.take())
        got = []
        after = asyncio.ensure_future(_take(slots, got, "after"))
        await _turns()
        cancelled.cancel()
        await _turns()
        slots.give()
        await _turns()
        assert got == ["after"] and slots.used == 1 and not slots.waiters

    asyncio.run(main())


def test_a_reader_woken_and_cancelled_in_the_same_turn_passes_its_slot_on():
    async def main():
        slots = Slots(1)
        await slots.take()
        first = asyncio.ensure_future(slots.take())
        got = []
        second = asyncio.ensure_future(_take(slots, got, "second"))
        await _turns()
        slots.give()  # first's waiter gets the slot ...
        first.cancel()  # ... and first is cancelled before it runs
        await _turns()
        assert first.cancelled() and got == ["second"] and slots.used == 1
        await second

    asyncio.run(main())


def test_a_connections_slots_are_shared_by_its_streams_and_dropped_with_the_last():
    table = ConnectionSlots(3)
    a = table.open("ipv4:1")
    assert table.open("ipv4:1") is a and table.open("ipv4:2") is not a
    table.close("ipv4:1", a)
    assert table.by_peer["ipv4:1"] is a
    table.close("ipv4:1", a)
    assert "ipv4:1" not in table.by_peer and "ipv4:2" in table.by_peer
