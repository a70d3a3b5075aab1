"""What a process's loop needs of its channels, and an in-memory implementation.

`Transport` makes a process's inbox and outboxes. The real one is shm/channel.py's
Unix sockets (`SOCKETS`); `MemoryHub` passes the same msgspec frames between inboxes
of one process, so a scheduler, its workers and its frontends can run as loops on one
event loop in a test (tests/loop/), with the wire contract kept: every message is
encoded and decoded with the inbox's own types, as a socket would carry it.

Delivery follows the sockets' rules where loops can see them: what an Outbox sends in
one pass of the loop reaches the peer as one burst (one `after_burst`), cork() holds
frames until uncork(), a pausable inbox that is not watched keeps its frames for
drain() or the next watch(True), and frames to a peer not listening yet wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, Iterable, Protocol

import msgspec

from shm import channel


class InboxLike(Protocol):
    address: str

    def attach(self, loop: asyncio.AbstractEventLoop, handle: Callable[[Any], None],
               after_burst: Callable[[], None] | None = None, *,
               pausable: bool = False) -> None: ...

    def watch(self, on: bool) -> None: ...

    def drain(self) -> None: ...

    def recv(self, timeout_ms: int | None = None) -> Any | None: ...

    def close(self) -> None: ...


class OutboxLike(Protocol):
    stopping: bool  # this process stops: a peer gone is expected (logged at info)

    def send(self, address: str, msg: Any) -> bool: ...

    def send_many(self, messages: Iterable[tuple[str, Any]]) -> None: ...

    def cork(self) -> None: ...

    def uncork(self) -> None: ...

    def drop(self, address: str) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def inbox(self, address: str, types: Iterable[type]) -> InboxLike: ...

    def outbox(self, loop: asyncio.AbstractEventLoop | None = None) -> OutboxLike: ...


class SocketTransport:
    """Unix stream sockets between processes (shm/channel.py)."""

    inbox = staticmethod(channel.Inbox)
    outbox = staticmethod(channel.Outbox)


SOCKETS: Transport = SocketTransport()


class MemoryHub:
    """Inboxes by address, in one process. Thread-safe where the sockets are: worker
    threads may send (blocking Outboxes have no loop), and a thread may recv()."""

    def __init__(self):
        self.inboxes: dict[str, MemoryInbox] = {}
        self._waiting: dict[str, list[bytes]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def inbox(self, address: str, types: Iterable[type]) -> "MemoryInbox":
        box = MemoryInbox(self, address, types)
        with self._lock:
            self.inboxes[address] = box
            early = self._waiting.pop(address, [])
        if early:  # sent before it listened, as a loop's Outbox retries a child starting
            box.receive(early)
        return box

    def outbox(self, loop: asyncio.AbstractEventLoop | None = None) -> "MemoryOutbox":
        return MemoryOutbox(self, loop)

    def deliver(self, address: str, frames: list[bytes], wait: bool) -> bool:
        with self._lock:
            box = self.inboxes.get(address)
            if box is None:
                if wait:
                    self._waiting[address].extend(frames)
                return wait
        box.receive(frames)
        return True

    def _closed(self, box: "MemoryInbox") -> None:
        with self._lock:
            if self.inboxes.get(box.address) is box:
                del self.inboxes[box.address]


class MemoryInbox:
    def __init__(self, hub: MemoryHub, address: str, types: Iterable[type]):
        self.address = address
        self._hub = hub
        types = tuple(types)
        self._decode = msgspec.msgpack.Decoder(types[0] if len(types) == 1 else
                                                channel._union(types)).decode
        self._frames: collections.deque[bytes] = collections.deque()
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: Callable[[Any], None] | None = None
        self._after: Callable[[], None] | None = None
        self._watching = True
        self._scheduled = False
        self.closed = False

    def receive(self, frames: list[bytes]) -> None:
        """A peer's burst: delivered on the owner's loop in one pass."""
        with self._lock:
            if self.closed:
                return
            self._frames.extend(frames)
            self._lock.notify()
            loop = self._loop
            if loop is None or not self._watching or self._scheduled:
                return
            self._scheduled = True
        loop.call_soon_threadsafe(self._burst)

    def _take(self) -> list[Any]:
        with self._lock:
            frames, self._frames = list(self._frames), collections.deque()
        msgs = []
        for frame in frames:
            try:
                msgs.append(self._decode(frame))
            except msgspec.DecodeError as exc:
                channel.log.error("dropping malformed message on %s: %s", self.address, exc)
        return msgs

    def _deliver(self, msgs: list[Any]) -> None:
        for msg in msgs:
            try:
                self._handle(msg)
            except Exception:
                channel.log.exception("handler failed for %s", type(msg).__name__)

    def _burst(self) -> None:
        with self._lock:
            self._scheduled = False
            if self.closed or not self._watching:
                return
        self._deliver(self._take())
        if self._after is not None:
            self._after()

    def attach(self, loop, handle, after_burst=None, *, pausable=False) -> None:
        with self._lock:
            self._loop, self._handle, self._after = loop, handle, after_burst
            pending = bool(self._frames)
        if pending:
            self.watch(True)
            self._schedule()

    def _schedule(self) -> None:
        with self._lock:
            if self._scheduled or not self._frames:
                return
            self._scheduled = True
        self._loop.call_soon(self._burst)

    def watch(self, on: bool) -> None:
        self._watching = on
        if on:
            self._schedule()  # level-triggered, as epoll is: what waits wakes it

    def drain(self) -> None:
        self._deliver(self._take())

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        with self._lock:
            if not self._lock.wait_for(lambda: self._frames or self.closed,
                                       None if timeout_ms is None else timeout_ms / 1000):
                return None
            if not self._frames:
                return None
            frame = self._frames.popleft()
        return self._decode(frame)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._frames.clear()
            self._lock.notify_all()
        self._hub._closed(self)


class MemoryOutbox:
    """Frames per peer, written at the end of the loop's pass (or at uncork()); with
    no loop (a thread), at once."""

    def __init__(self, hub: MemoryHub, loop: asyncio.AbstractEventLoop | None):
        self._hub = hub
        self.loop = loop
        self._queues: dict[str, list[bytes]] = {}
        self._corked = False
        self._scheduled = False
        self.stopping = False  # as channel.Outbox's (nothing here logs a peer gone)

    def send(self, address: str, msg: Any) -> bool:
        return self._send(address, [channel.encode(msg)])

    def send_many(self, messages: Iterable[tuple[str, Any]]) -> None:
        by_peer: dict[str, list[bytes]] = {}
        for address, msg in messages:
            by_peer.setdefault(address, []).append(channel.encode(msg))
        for address, frames in by_peer.items():
            self._send(address, frames)

    def _send(self, address: str, frames: list[bytes]) -> bool:
        if self.loop is None:
            return self._hub.deliver(address, frames, wait=False)
        self._queues.setdefault(address, []).extend(frames)
        if not self._corked and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._scheduled = False
        queues, self._queues = self._queues, {}
        for address, frames in queues.items():
            self._hub.deliver(address, frames, wait=True)

    def cork(self) -> None:
        self._corked = True

    def uncork(self) -> None:
        self._corked = False
        if self._queues:
            self._flush()

    def drop(self, address: str) -> None:
        self._queues.pop(address, None)

    def close(self) -> None:
        self._flush()
