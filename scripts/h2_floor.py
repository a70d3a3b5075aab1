"""A canned unary gRPC server written straight on HTTP/2 frames (asyncio protocol on
uvloop, `hpack` for request headers), for scripts/grpc_floor.py's `h2-raw` mode: what
one unary RPC costs a Python server that skips grpcio, to weigh a hand-written gRPC
front door against grpc.aio's floor.

Enough HTTP/2 for gRPC clients on cleartext (prior knowledge): the preface, SETTINGS
and their ACK, PING ACK, WINDOW_UPDATE for what was read, HEADERS (+CONTINUATION),
DATA, RST_STREAM and GOAWAY. Replies are small: the send side ignores the peer's flow
control window, which a real server must not. Every reply of one read goes out in one
write: HEADERS, DATA, trailing HEADERS, from bytes built once.
"""

from __future__ import annotations

import asyncio
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = \
    0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_HEAD = struct.Struct(">I B I")  # length (24 bits, in the first word) type flags stream


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, kind, flags)) + \
        struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """A header as HPACK's literal without indexing, new name, no Huffman (short)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


# :status 200 is static entry 8; content-type is static name 31
_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes((len(b"application/grpc"),)) + \
    b"application/grpc"
_TRAILERS = _literal(b"grpc-status", b"0")


class H2Connection(asyncio.Protocol):
    """One client connection; `replies` maps a method name to its serialized reply."""

    def __init__(self, replies: dict[str, bytes]):
        import hpack
        self.decoder = hpack.Decoder()
        self.replies = replies
        self.buf = bytearray()
        self.preface = False
        self.streams: dict[int, list] = {}  # id -> [path, body parts]
        self.pending_headers: tuple[int, int, bytearray] | None = None
        self.unacked = 0  # connection-level bytes read and not yet given back
        self.out: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport
        # our SETTINGS: a large stream window; the connection window grows by update
        settings = struct.pack(">HI", 0x4, 1 << 30) + struct.pack(">HI", 0x3, 1000)
        transport.write(frame(SETTINGS, 0, 0, settings) +
                        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 30) - 65535)))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        if not self.preface:
            if len(buf) < 24:
                return
            if bytes(buf[:24]) != PREFACE:
                self.transport.close()
                return
            self.preface, pos = True, 24
        end = len(buf)
        while end - pos >= 9:
            word, flags, stream = _HEAD.unpack_from(buf, pos)
            length = word >> 8
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            self.on_frame(word & 0xFF, flags, stream & 0x7FFFFFFF, payload)
        del buf[:pos]
        if self.unacked > (1 << 20):
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked)))
            self.unacked = 0
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == DATA:
            self.unacked += len(payload)
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            entry = self.streams.get(stream)
            if entry is not None:
                entry[1].append(payload)
                if flags & END_STREAM:
                    self.answer(stream)
        elif kind == HEADERS:
            if flags & PADDED:
                pad = payload[0]
                payload = payload[1:len(payload) - pad]
            if flags & PRIORITY:
                payload = payload[5:]
            if flags & END_HEADERS:
                self.on_headers(stream, payload, flags & END_STREAM)
            else:
                self.pending_headers = (stream, flags & END_STREAM, bytearray(payload))
        elif kind == CONTINUATION and self.pending_headers is not None:
            sid, end_stream, block = self.pending_headers
            block += payload
            if flags & END_HEADERS:
                self.pending_headers = None
                self.on_headers(sid, bytes(block), end_stream)
        elif kind == SETTINGS:
            if not flags & ACK:
                self.out.append(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.streams.pop(stream, None)
        elif kind == GOAWAY:
            self.transport.close()

    def on_headers(self, stream: int, block: bytes, end_stream: int) -> None:
        path = ""
        for name, value in self.decoder.decode(block, raw=True):
            if name == b":path":
                path = value.decode()
        if stream in self.streams:  # trailers of a request: not in gRPC's unary calls
            return
        self.streams[stream] = [path, []]
        if end_stream:
            self.answer(stream)

    def answer(self, stream: int) -> None:
        path, _ = self.streams.pop(stream)  # canned: the request is not parsed
        reply = self.replies.get(path.rsplit("/", 1)[-1])
        if reply is None:
            self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream,
                                  _RESPONSE_HEADERS + _literal(b"grpc-status", b"12")))
            return
        self.out.append(
            frame(HEADERS, END_HEADERS, stream, _RESPONSE_HEADERS)
            + frame(DATA, 0, stream, b"\x00" + struct.pack(">I", len(reply)) + reply)
            + frame(HEADERS, END_HEADERS | END_STREAM, stream, _TRAILERS))

    def connection_lost(self, exc) -> None:
        self.streams.clear()


def serve(port: int, replies: dict[str, bytes]) -> None:
    import uvloop

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: H2Connection(replies), "127.0.0.1",
                                          port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())
