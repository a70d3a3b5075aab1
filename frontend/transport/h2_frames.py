"""The vocabulary of h2.py: HTTP/2 frame types, flags, SETTINGS identifiers,
error codes, what this server advertises, frame building, and a stream's state."""

from __future__ import annotations

import asyncio
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20

# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)

# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, \
    STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = range(10)
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1

# What this server advertises. Large receive windows keep a 64 MiB request from
# waiting on round trips; what is read is given back once half a window is used.
RECV_STREAM_WINDOW = 1 << 24
RECV_CONN_WINDOW = 1 << 26
RECV_MAX_FRAME = 1 << 20
WRITELINES_MIN = 1 << 16  # bytes of pending frames written without joining them
STREAM_WRITE_HIGH = 1 << 20  # a stream holding more unsent bytes makes writers wait

_HEAD = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
_U32 = struct.Struct(">I")


class ConnectionError_(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def frame_head(length: int, kind: int, flags: int, stream: int) -> bytes:
    return _HEAD.pack((length << 8) | kind, flags, stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack((len(payload) << 8) | kind, flags, stream) + payload


class Stream:
    """One HTTP/2 stream, as the server sees it."""

    __slots__ = ("id", "send_window", "recv_unacked", "recv_held", "pending",
                 "pending_bytes", "trailers", "remote_closed", "local_closed",
                 "headers_sent", "waiter", "app", "expect")

    def __init__(self, sid: int, send_window: int):
        self.id = sid
        self.send_window = send_window
        self.recv_unacked = 0
        # of those, bytes the layer above still holds unread (H2Connection.hold): their
        # window is given back when it reads them, not on arrival
        self.recv_held = 0
        self.pending: list[memoryview] = []  # data waiting for window
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # header block to send once pending is out
        self.remote_closed = False
        self.local_closed = False
        self.headers_sent = False
        self.waiter: asyncio.Future | None = None  # a writer waiting for room
        self.app = None  # the layer above's per-stream state
        self.expect: int | None = None  # body bytes still due by content-length
