"""How many requests the ModelStreamInfer streams of one client connection may have
running at once.

A stream's requests each run as a task of their own (grpc_server.model_stream_infer),
so without a bound a client that pipelines requests on a stream, and perhaps never
reads the answers, makes the frontend hold as much work, and as many answers waiting
for its window, as it cares to send. Unary calls are bounded by the connection's
MAX_CONCURRENT_STREAMS (h2_limits.Limits.max_streams); the requests of all the
connection's streams together get the same number of slots. A stream whose connection
has none free is not read until one frees: what its client sends waits in the
flow-control window (grpc_native.RequestStream holds it; grpc-core alike), and the
client waits with it, with no error. Readers waiting for a slot get it in the order
they asked. Triton reads a stream's requests as they come, without a bound.

A connection is known by its peer address, which both gRPC engines report
(`context.peer()`).
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """The slots of one connection's streams."""

    __slots__ = ("cap", "used", "waiters", "streams")

    def __init__(self, cap: int):
        self.cap = cap
        self.used = 0
        self.waiters: deque[asyncio.Future] = deque()
        self.streams = 0  # streams of the connection using them

    def try_take(self) -> bool:
        """One slot now, if one is free and nobody waits for it."""
        if self.used < self.cap and not self.waiters:
            self.used += 1
            return True
        return False

    async def take(self) -> None:
        """One slot, once there is one (in turn with the other readers waiting)."""
        if self.try_take():
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # give() counted the slot as ours when it woke us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # woken and cancelled in the same turn: pass it on
            elif waiter in self.waiters:
                self.waiters.remove(waiter)
            raise

    def give(self, _task=None) -> None:
        """A slot freed (also a task's done callback): to the first reader waiting."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.used -= 1


class ConnectionSlots:
    """The Slots of each connection with a stream open, by peer."""

    def __init__(self, cap: int):
        self.cap = cap
        self.by_peer: dict[str, Slots] = {}

    def open(self, peer: str) -> Slots:
        slots = self.by_peer.get(peer)
        if slots is None:
            slots = self.by_peer[peer] = Slots(self.cap)
        slots.streams += 1
        return slots

    def close(self, peer: str, slots: Slots) -> None:
        """A stream ended; the connection's Slots go with its last one (requests
        still ending give their slots back to the object they hold)."""
        slots.streams -= 1
        if not slots.streams and self.by_peer.get(peer) is slots:
            del self.by_peer[peer]
