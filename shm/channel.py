"""Framed message channels between processes: ZeroMQ `ipc://` PUSH/PULL pairs.

Every process binds one PULL socket, its inbox, and keeps one PUSH socket per peer it
sends to. ZeroMQ frames each message, queues while a peer (re)starts and needs no
accept loop; against asyncio Unix sockets with length prefixes it saved ~15 us per
message here because framing and buffering run in C, off the GIL.

Messages are msgspec Structs tagged by class name and encoded as msgpack. A decoder
accepts only the union of types its inbox expects: anything else is a protocol error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

import msgspec
import zmq

log = logging.getLogger("shmserve.channel")

_CTX: zmq.Context | None = None

# pyzmq's constants are enums: every `&` or flag argument on them goes through the enum
# machinery, which showed up in profiles of the hot path. Plain ints do not.
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def context() -> zmq.Context:
    global _CTX
    if _CTX is None:
        _CTX = zmq.Context(io_threads=1)
    return _CTX


def ipc_address(run_dir: str, name: str) -> str:
    return f"ipc://{run_dir}/{name}"


class Inbox:
    """The bound PULL socket of one process, decoding into a fixed set of types."""

    def __init__(self, address: str, types: Iterable[type]):
        self.address = address
        self.sock = context().socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        types = tuple(types)
        self._decoder = msgspec.msgpack.Decoder(types[0] if len(types) == 1 else
                                                 _union(types))

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """Blocking receive (worker loops); None on timeout."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return self._decoder.decode(self.sock.recv(copy=True))

    def attach(self, loop: asyncio.AbstractEventLoop, handle: Callable[[Any], None],
               after_burst: Callable[[], None] | None = None) -> None:
        """Deliver every message to `handle` from the event loop, without a task per recv;
        `after_burst` runs once each time the socket has been drained.

        ZeroMQ's FD is edge-triggered: each wake-up must drain the socket completely.
        """
        sock, decode = self.sock, self._decoder.decode

        def on_readable():
            while sock.getsockopt(_EVENTS) & _POLLIN:
                try:
                    frame = sock.recv(_NOBLOCK, copy=True)
                except zmq.Again:
                    break
                try:
                    msg = decode(frame)
                except msgspec.DecodeError as exc:
                    log.error("dropping malformed message on %s: %s", self.address, exc)
                    continue
                try:
                    handle(msg)
                except Exception:
                    log.exception("handler failed for %s", type(msg).__name__)
            if after_burst is not None:
                after_burst()

        loop.add_reader(sock.getsockopt(zmq.FD), on_readable)
        # messages that arrived before we attached never raise the edge again
        loop.call_soon(on_readable)

    def close(self) -> None:
        self.sock.close(0)


def _union(types: tuple[type, ...]):
    import typing
    return typing.Union[types]  # type: ignore[valid-type]


_ENCODER = msgspec.msgpack.Encoder()
encode = _ENCODER.encode


class Outbox:
    """PUSH sockets to peers, connected lazily and kept."""

    def __init__(self):
        self._socks: dict[str, zmq.Socket] = {}

    def _sock(self, address: str) -> zmq.Socket:
        sock = self._socks.get(address)
        if sock is None:
            sock = context().socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            # bounded, so messages to a peer that died do not pile up forever
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.connect(address)
            self._socks[address] = sock
        return sock

    def send(self, address: str, msg: Any) -> bool:
        """Queue one message; False if the peer's queue is full (it is gone)."""
        try:
            # copy=True: for messages of a few hundred bytes, zero-copy frames cost
            # more to track than the copy they save
            self._sock(address).send(_ENCODER.encode(msg), _NOBLOCK)
            return True
        except zmq.Again:
            log.warning("peer %s is not reading; dropped %s", address, type(msg).__name__)
            return False

    def drop(self, address: str) -> None:
        """Forget a peer that is gone, and what was queued for it."""
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close(0)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(0)
        self._socks.clear()
