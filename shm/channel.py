"""Framed message channels between processes: Unix stream sockets, read and written
by the thread that owns them.

Every process binds one listening socket, its inbox; peers connect to it and keep the
connection. A frame is a 4-byte little-endian length and a msgpack body. Reading drains
whatever a connection holds in one `recv_into`, so a burst of messages costs one
system call and one wake-up.

Why not ZeroMQ (what this module used first): a ZeroMQ message passes through an I/O
thread on each side, three thread wake-ups per message where a socket needs one. On the
2-core dev VM, where a wake-up costs 50-150 us, a ping-pong between two asyncio loops
cost 300-600 us of CPU per round trip on each side with `ipc://` PUSH/PULL and 100-160
us with this (1.1 ms against 0.23-0.30 ms of wall time); see the closing note of
issue 3.

Sending: an Outbox given an event loop never blocks on a peer. Frames wait in a
per-peer queue that the loop writes out at the end of the current pass (one system
call, one wake-up of the peer for a burst of messages), and what the socket does not
take then is written when the peer reads; a peer not listening yet (a child starting)
is retried for a while before its messages are dropped. An Outbox without a loop (worker threads) sends blocking, with a timeout
after which the peer is given up. Each Outbox belongs to one thread.

Messages are msgspec Structs tagged by class name and encoded as msgpack. A decoder
accepts only the union of types its inbox expects: anything else is a protocol error.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import select
import selectors
import socket
import struct
import time
from typing import Any, Callable, Iterable

import msgspec

log = logging.getLogger("shmserve.channel")

_HEADER = struct.Struct("<I")
_READ_BYTES = 1 << 20           # one recv_into takes up to this much
_SOCKET_BUFFER = 4 << 20        # asked of the kernel each way (it may grant less)
_BLOCKING_SEND_TIMEOUT = 30.0   # a thread's send to a peer that stopped reading
_CONNECT_RETRY = 0.02           # a loop's retry of a peer not listening yet...
_CONNECT_PATIENCE = 30.0        # ...until it has been absent this long
_IOV_MAX = 512                  # frames per sendmsg
# A loop's frames to one peer wait for the end of its pass, to go in one write; this
# many go at once. A frontend's pass over a wave of requests (64 HTTP connections
# answered by one batch, all ready again together) decoded every one of them before
# the scheduler saw the first, so on two cores the scheduler and the workers waited
# while the frontend parsed and the frontend waited while they ran. Writing every 16
# frames lets them start on the first while the frontend goes on: wrk at 64
# connections served 32-40% more a second (h2load 8-29%) at the same CPU a request
# (docs/performance.md); a pass with fewer frames, c=1 included, is unchanged.
# SHMSERVE_EARLY_FLUSH sets another count, for measuring.
EARLY_FLUSH = max(1, int(os.environ.get("SHMSERVE_EARLY_FLUSH", "16")))


def ipc_address(run_dir: str, name: str) -> str:
    return f"ipc://{run_dir}/{name}"


def _path(address: str) -> str:
    return address[len("ipc://"):] if address.startswith("ipc://") else address


class _Connection:
    """One accepted connection: its socket and the start of a frame not yet whole."""

    __slots__ = ("sock", "partial")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.partial = bytearray()


class Inbox:
    """The listening socket of one process, decoding into a fixed set of types."""

    def __init__(self, address: str, types: Iterable[type]):
        self.address = address
        self._path = _path(address)
        try:
            os.unlink(self._path)  # a stale socket of an earlier process
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self._path)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self._conns: dict[int, _Connection] = {}
        self._buf = bytearray(_READ_BYTES)
        self._view = memoryview(self._buf)
        types = tuple(types)
        self._decode = msgspec.msgpack.Decoder(types[0] if len(types) == 1 else
                                                _union(types)).decode
        self._ready: collections.deque = collections.deque()  # blocking recv's backlog
        self._selector: selectors.BaseSelector | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Callable[[Any], None] | None = None
        # attach(pausable=True): the connections' own epoll set, one descriptor for the
        # loop to watch or not (watch()), however many peers there are
        self._nest: select.epoll | None = None
        self._on_nest: Callable[[], None] | None = None
        self._watching = True

    # -- reading ------------------------------------------------------------------------

    def _accept(self) -> list[_Connection]:
        new = []
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return new
            except OSError as exc:  # e.g. out of descriptors: try again on the next wake
                log.error("accept on %s failed: %s", self.address, exc)
                return new
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
            conn = _Connection(sock)
            self._conns[sock.fileno()] = conn
            new.append(conn)

    def _read(self, conn: _Connection, deliver: Callable[[Any], None]) -> bool:
        """Deliver every whole frame the connection holds; False once it has closed."""
        sock, buf, view = conn.sock, self._buf, self._view
        while True:
            try:
                n = sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                n = 0
            if n == 0:
                return False
            if conn.partial:
                partial = conn.partial
                partial += view[:n]
                if len(partial) < 4 or len(partial) - 4 < _HEADER.unpack_from(partial)[0]:
                    if n < len(buf):
                        return True
                    continue  # a frame larger than one read: keep gathering it
                data = memoryview(partial)
            else:
                data = view[:n]
            end = len(data)
            pos = 0
            while end - pos >= 4:
                size = _HEADER.unpack_from(data, pos)[0]
                if end - pos - 4 < size:
                    break
                start = pos + 4
                pos = start + size
                try:
                    msg = self._decode(data[start:pos])
                except msgspec.DecodeError as exc:
                    log.error("dropping malformed message on %s: %s", self.address, exc)
                    continue
                deliver(msg)
            rest = bytes(data[pos:]) if pos < end else b""
            data.release()
            conn.partial = bytearray(rest)
            if n < len(buf):
                return True  # most likely drained; the level-triggered poll says if not

    def _drop(self, conn: _Connection) -> None:
        fd = conn.sock.fileno()
        self._conns.pop(fd, None)
        if self._nest is not None:
            self._nest.unregister(fd)
        elif self._loop is not None:
            self._loop.remove_reader(fd)
        elif self._selector is not None:
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """Blocking receive (worker loops); None on timeout."""
        if self._selector is None:
            self._selector = selectors.DefaultSelector()
            self._selector.register(self.listener, selectors.EVENT_READ)
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        ready, deliver = self._ready, self._ready.append
        while not ready:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            events = self._selector.select(wait)
            for key, _ in events:
                if key.fileobj is self.listener:
                    for conn in self._accept():
                        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
                elif not self._read(key.data, deliver):
                    self._drop(key.data)
            if not events and deadline is not None and time.monotonic() >= deadline:
                return None
        return ready.popleft()

    def attach(self, loop: asyncio.AbstractEventLoop,
               handle: Callable[[Any], None] | dict[type, Callable[[Any], None]],
               after_burst: Callable[[], None] | None = None, *,
               pausable: bool = False) -> None:
        """Deliver every message to `handle` from the event loop, without a task per
        message (a dict: to its handler for the message's type, with no call of ours
        between); `after_burst` runs once after each connection's burst is handled
        (pausable: once after each wake, and watch() may pause it)."""
        self._loop = loop

        table = handle if isinstance(handle, dict) else None

        def deliver(msg):
            try:
                (handle if table is None else table[type(msg)])(msg)
            except Exception:
                log.exception("handler failed for %s", type(msg).__name__)

        def on_readable(conn: _Connection):
            if not self._read(conn, deliver):
                self._drop(conn)
            if after_burst is not None:
                after_burst()

        def on_nest():
            for fd, _ in self._nest.poll(0):
                conn = self._conns.get(fd)
                if conn is not None and not self._read(conn, deliver):
                    self._drop(conn)
            if after_burst is not None:
                after_burst()

        def on_connect():
            for conn in self._accept():
                if self._nest is not None:
                    self._nest.register(conn.sock.fileno(), select.EPOLLIN)
                else:
                    loop.add_reader(conn.sock.fileno(), on_readable, conn)

        self._deliver = deliver
        if pausable:
            self._nest, self._on_nest = select.epoll(), on_nest
            loop.add_reader(self._nest.fileno(), on_nest)
        loop.add_reader(self.listener.fileno(), on_connect)

    def watch(self, on: bool) -> None:
        """A pausable inbox: whether a message wakes the loop. Unwatched, messages wait
        in the kernel's buffers for drain() or the next watch(True), which wakes the
        loop at once for any already there (epoll is level-triggered)."""
        if on == self._watching or self._nest is None:
            return
        self._watching = on
        if on:
            self._loop.add_reader(self._nest.fileno(), self._on_nest)
        else:
            self._loop.remove_reader(self._nest.fileno())

    def drain(self) -> None:
        """Attached inboxes: deliver whatever the connections hold now, without
        waiting (the caller runs its after-burst work itself). A pausable inbox asks
        its epoll set which connections hold anything: one system call when none do."""
        if self._nest is not None:
            conns = [c for fd, _ in self._nest.poll(0) if (c := self._conns.get(fd))]
        else:
            conns = list(self._conns.values())
        for conn in conns:
            if not self._read(conn, self._deliver):
                self._drop(conn)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._loop is not None:
            self._loop.remove_reader(self.listener.fileno())
        if self._nest is not None:
            if self._watching:
                self._loop.remove_reader(self._nest.fileno())
            self._nest.close()
        self.listener.close()
        if self._selector is not None:
            self._selector.close()
        try:
            os.unlink(self._path)
        except OSError:
            pass


def _union(types: tuple[type, ...]):
    import typing
    return typing.Union[types]  # type: ignore[valid-type]


_ENCODER = msgspec.msgpack.Encoder()
encode = _ENCODER.encode


def _frame(msg: Any) -> bytes:
    body = encode(msg)
    return _HEADER.pack(len(body)) + body


class _Peer:
    """A connection to one peer's inbox, and what waits to be written to it."""

    __slots__ = ("address", "sock", "loop", "queue", "since", "retry", "writer")

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop | None):
        self.address = address
        self.sock: socket.socket | None = None
        self.loop = loop
        self.queue: collections.deque = collections.deque()  # frames not yet written
        self.since = time.monotonic()  # when it was first found absent
        self.retry: asyncio.TimerHandle | None = None
        self.writer = False  # the loop watches the socket for room to write

    def connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(_path(self.address))
        except OSError:
            sock.close()
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        if self.loop is None:
            # the kernel times the send out (SO_SNDTIMEO): a Python socket timeout
            # would poll() before every send, a system call per message
            sec = int(_BLOCKING_SEND_TIMEOUT)
            usec = int((_BLOCKING_SEND_TIMEOUT - sec) * 1e6)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", sec, usec))
        else:
            sock.setblocking(False)
        self.sock = sock
        return True

    def close(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None
        if self.sock is not None:
            if self.writer:
                self.writer = False
                if not self.loop.is_closed():
                    self.loop.remove_writer(self.sock.fileno())
            self.sock.close()
            self.sock = None
        self.queue.clear()


class Outbox:
    """Connections to peers, made on first send and kept; owned by one thread, the
    thread of `loop` if it has one (set it before the first send)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop
        self._peers: dict[str, _Peer] = {}
        # corked: frames queue until uncork() writes them (see cork())
        self._corked = False
        self._held: list[_Peer] = []
        # Set when this process begins to stop: its peers stop too, so a peer gone
        # then is expected, not a fault, and is logged at info (operators alert on
        # warnings; a clean restart must raise none).
        self.stopping = False

    def send(self, address: str, msg: Any) -> bool:
        """Send or queue one message; False if the peer is known to be gone."""
        return self._send(address, [_frame(msg)], type(msg).__name__)

    def send_many(self, messages: Iterable[tuple[str, Any]]) -> None:
        """Send (address, message) pairs; those to one peer go out in one write, in
        their order (a batch's responses to one frontend: one system call, one wake-up)."""
        by_peer: dict[str, list[bytes]] = {}
        for address, msg in messages:
            by_peer.setdefault(address, []).append(_frame(msg))
        for address, frames in by_peer.items():
            self._send(address, frames, f"{len(frames)} message(s)")

    def _send(self, address: str, frames: list[bytes], what: str) -> bool:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer(address, self.loop)
            if not peer.connect():
                if peer.loop is None:  # a thread has no loop to retry from
                    return self._gone(peer, what)
                peer.queue.extend(frames)
                peer.retry = peer.loop.call_later(_CONNECT_RETRY, self._reconnect, peer)
                return True
        if peer.loop is None:
            try:
                peer.sock.sendall(frames[0] if len(frames) == 1 else b"".join(frames))
                return True
            except OSError as exc:  # gone, or stopped reading for the whole timeout
                log.debug("send to %s failed: %s", address, exc)
                return self._gone(peer, what)
        queue = peer.queue
        queue.extend(frames)
        # the first frames of a pass schedule the write; later ones (and frames behind a
        # full socket or an absent peer) go with them
        if len(queue) == len(frames) and peer.sock is not None:
            if self._corked:
                self._held.append(peer)
            else:
                peer.loop.call_soon(self._flush, peer)
        elif len(queue) >= EARLY_FLUSH and not self._corked and peer.sock is not None \
                and not peer.writer:
            # a burst: what is queued goes now, while the rest is still being made
            self._flush(peer)
            return self._peers.get(address) is peer
        return True

    def cork(self) -> None:
        """Hold what is sent from now on until `uncork()`, which the caller promises to
        call before its callback returns. A write scheduled with call_soon costs a
        second pass of the loop (an epoll_wait and the loop's own work) for every
        burst; a loop that knows where its pass ends writes there instead."""
        self._corked = True

    def uncork(self) -> None:
        """Write out what was held since `cork()`, one write per peer."""
        self._corked = False
        if self._held:
            held, self._held = self._held, []
            for peer in held:
                self._flush(peer)

    def _gone(self, peer: _Peer, what: str) -> bool:
        (log.info if self.stopping else log.warning)("peer %s is gone; dropped %s",
                                                     peer.address, what)
        self.drop(peer.address)
        return False

    def _reconnect(self, peer: _Peer) -> None:
        peer.retry = None
        if self._peers.get(peer.address) is not peer:
            return
        if peer.connect():
            self._flush(peer)
        elif time.monotonic() - peer.since < _CONNECT_PATIENCE:
            peer.retry = peer.loop.call_later(_CONNECT_RETRY, self._reconnect, peer)
        else:
            self._gone(peer, f"{len(peer.queue)} message(s)")

    def _flush(self, peer: _Peer) -> None:
        """Write what the peer's queue holds, as far as the socket takes it."""
        queue, sock = peer.queue, peer.sock
        if sock is None or self._peers.get(peer.address) is not peer:
            return  # dropped, or waiting to connect
        while queue:
            frames = list(itertools.islice(queue, _IOV_MAX))
            try:
                n = sock.sendmsg(frames)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._gone(peer, f"{len(queue)} message(s)")
                return
            for frame in frames:
                if n < len(frame):  # the socket is full: go on when the peer has read
                    if n:
                        queue[0] = memoryview(frame)[n:]
                    if not peer.writer:
                        peer.loop.add_writer(sock.fileno(), self._flush, peer)
                        peer.writer = True
                    return
                n -= len(frame)
                queue.popleft()
        if peer.writer:
            peer.loop.remove_writer(sock.fileno())
            peer.writer = False

    def drop(self, address: str) -> None:
        """Forget a peer that is gone, and what was queued for it."""
        peer = self._peers.pop(address, None)
        if peer is not None:
            peer.close()

    def close(self) -> None:
        """Write out what is still queued (a process's last words, such as a frontend's
        FrontendStopped, are sent just before it closes), then close every connection."""
        for peer in self._peers.values():
            if peer.queue and peer.sock is not None:
                try:
                    peer.sock.settimeout(2.0)
                    peer.sock.sendall(b"".join(peer.queue))
                except OSError:
                    pass
            peer.close()
        self._peers.clear()
