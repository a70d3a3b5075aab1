"""Bytes for scripts/attack_probe.py, built by hand so the probe can send what no
well-behaved client library would: HTTP/2 frames (RFC 9113), HPACK blocks (RFC 7541,
no Huffman), gRPC messages and length prefixes, ModelInferRequest protobufs, and
HTTP/1.1 requests. Pure functions and one incremental frame reader; no sockets."""

from __future__ import annotations

import json
import struct
import zlib

from frontend.transport.h2_hpack import hpack_int  # the server's own RFC 7541 5.1

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)
DEFAULT_SETTINGS = {HEADER_TABLE_SIZE: 4096, INITIAL_WINDOW_SIZE: 65535,
                    MAX_FRAME_SIZE: 16384}

ERROR_CODES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR",
               3: "FLOW_CONTROL_ERROR", 4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED",
               6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
               9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
               12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}
CANCEL = 8

GRPC_STATUS = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
               4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
               7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
               10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
               14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
LOAD_PATH = "/inference.GRPCInferenceService/RepositoryModelLoad"


def error_name(code: int) -> str:
    return ERROR_CODES.get(code, f"0x{code:x}")


# ------------------------------------------------------------------------- frames

def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    if len(payload) >= 1 << 24:
        raise ValueError("frame payload too long")
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + \
        struct.pack(">I", stream_id & 0x7FFFFFFF) + payload


def settings(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    payload = b"".join(struct.pack(">HI", k, v) for k, v in (values or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, payload)


def ping(opaque: bytes = b"\0" * 8, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, opaque.ljust(8, b"\0")[:8])


def rst_stream(stream_id: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def data_frames(stream_id: int, body: bytes, max_frame: int = 16384,
                end_stream: bool = True) -> list[bytes]:
    """`body` cut into DATA frames of at most max_frame bytes; END_STREAM on the last."""
    if not body:
        return [frame(DATA, END_STREAM if end_stream else 0, stream_id)]
    out = []
    for i in range(0, len(body), max_frame):
        last = i + max_frame >= len(body)
        out.append(frame(DATA, END_STREAM if (last and end_stream) else 0, stream_id,
                         body[i:i + max_frame]))
    return out


def parse_goaway(payload: bytes) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data)."""
    if len(payload) < 8:
        return 0, 1, b""
    last, code = struct.unpack(">II", payload[:8])
    return last & 0x7FFFFFFF, code, payload[8:]


def parse_settings(payload: bytes) -> dict[int, int]:
    return {k: v for k, v in (struct.unpack(">HI", payload[i:i + 6])
                              for i in range(0, len(payload) - len(payload) % 6, 6))}


class FrameReader:
    """Frames out of a byte stream fed in pieces. Payloads longer than `keep` bytes are
    counted but not kept (only their first `keep` bytes), so a peer's huge frame cannot
    grow the probe's memory."""

    def __init__(self, keep: int = 1 << 16):
        self.keep = keep
        self._buf = bytearray()
        self._skip = 0          # bytes of a too-long payload still to drop
        self._partial = None    # (kind, flags, sid, kept payload) awaiting its skip
        self.preface_seen = False

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        out = []
        view = memoryview(data)
        if self._skip:
            n = min(self._skip, len(view))
            self._skip -= n
            view = view[n:]
            if not self._skip and self._partial:
                out.append(self._partial)
                self._partial = None
        self._buf += view
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            kind, flags = self._buf[3], self._buf[4]
            sid = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            if length > self.keep:
                have = len(self._buf) - 9
                if have < self.keep:
                    break  # the head we keep is not all here yet
                kept = bytes(self._buf[9:9 + self.keep])
                if have >= length:
                    out.append((kind, flags, sid, kept))
                    del self._buf[:9 + length]
                    continue
                self._skip = length - have
                self._partial = (kind, flags, sid, kept)
                self._buf.clear()
                break
            if len(self._buf) < 9 + length:
                break
            out.append((kind, flags, sid, bytes(self._buf[9:9 + length])))
            del self._buf[:9 + length]
        return out


# --------------------------------------------------------------------------- HPACK

def hpack_str(s: bytes | str) -> bytes:
    """A string literal, raw (no Huffman)."""
    b = s.encode() if isinstance(s, str) else s
    return hpack_int(len(b), 7) + b


def hp_indexed(index: int) -> bytes:
    """6.1: a field from the static (1..61) or dynamic (62..) table."""
    return hpack_int(index, 7, 0x80)


def hp_literal(name: bytes | str | int, value: bytes | str, index: bool = False) -> bytes:
    """6.2.1 (index=True: added to the dynamic table) or 6.2.2 (not indexed). An int
    name is a table index."""
    prefix, first = (6, 0x40) if index else (4, 0x00)
    if isinstance(name, int):
        return hpack_int(name, prefix, first) + hpack_str(value)
    return bytes((first,)) + hpack_str(name) + hpack_str(value)


# static table indexes (RFC 7541 appendix A)
ST_AUTHORITY, ST_METHOD_POST, ST_PATH, ST_SCHEME_HTTP, ST_CONTENT_TYPE = 1, 3, 4, 6, 31


def request_block(authority: str, path: str = INFER_PATH,
                  extra: list[tuple[str, str]] = ()) -> bytes:
    """The header block of a gRPC request; nothing goes into the dynamic table."""
    return (hp_indexed(ST_METHOD_POST) + hp_indexed(ST_SCHEME_HTTP)
            + hp_literal(ST_PATH, path) + hp_literal(ST_AUTHORITY, authority)
            + hp_literal(ST_CONTENT_TYPE, "application/grpc")
            + hp_literal("te", "trailers")
            + b"".join(hp_literal(k, v) for k, v in extra))


def amplification_entry(table_size: int = 4096, name: str = "x-amp") -> tuple[bytes, int]:
    """(a literal that puts the largest field that fits `table_size` into the dynamic
    table, its decoded size): the entry's size is name + value + 32 (RFC 7541 4.1)."""
    value_len = max(1, min(4000, table_size - 32 - len(name)))
    return hp_literal(name, b"a" * value_len, index=True), len(name) + value_len


# ---------------------------------------------------------------------------- gRPC

def grpc_prefix(length: int, compressed: bool = False) -> bytes:
    """The 5-byte message prefix; `length` may exceed what follows (a lie)."""
    return bytes((1 if compressed else 0,)) + struct.pack(">I", length & 0xFFFFFFFF)


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return grpc_prefix(len(payload), compressed) + payload


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as protobuf writes them
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _pb_bytes(field: int, value: bytes | str) -> bytes:
    b = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(b)) + b


def model_infer_request(model: str, input_name: str, shape: list[int], raw: bytes,
                        datatype: str = "FP32") -> bytes:
    """inference.ModelInferRequest: model_name (1), inputs (5: name 1, datatype 2,
    packed shape 3), raw_input_contents (7)."""
    packed = b"".join(_varint(d) for d in shape)
    tensor = _pb_bytes(1, input_name) + _pb_bytes(2, datatype) + _pb_bytes(3, packed)
    return _pb_bytes(1, model) + _pb_bytes(5, tensor) + _pb_bytes(7, raw)


def model_load_request(name: str, config: str | None,
                       files: dict[str, bytes]) -> bytes:
    """inference.RepositoryModelLoadRequest: model_name (2), parameters (3: map of
    string to ModelRepositoryParameter: string_param 3 for "config", bytes_param 4
    for each file)."""
    out = _pb_bytes(2, name)
    if config is not None:
        out += _pb_bytes(3, _pb_bytes(1, "config") + _pb_bytes(2, _pb_bytes(3, config)))
    for key, content in files.items():
        entry = _pb_bytes(1, key) + _pb_bytes(2, _pb_bytes(4, content))
        out += _pb_bytes(3, entry)
    return out


def gzip_of_zeros(decompressed: int, chunk: int = 1 << 20) -> bytes:
    """A gzip member that inflates to `decompressed` zero bytes (~1/1000 of it). Each
    `chunk` of zeros is deflated once and ended with a full flush, which byte-aligns the
    stream and resets the history: every further chunk's bytes are the same, so they
    are repeated rather than deflated again (1 GiB in well under a second; a 1 MiB chunk
    deflates in ~5 ms, 64 MiB took ~0.3 s, and the ratio stays ~1:1000)."""
    chunk = min(chunk, decompressed)
    zeros = bytes(chunk)
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    whole, rest = divmod(decompressed, chunk)
    crc = 0
    for _ in range(whole):
        crc = zlib.crc32(zeros, crc)
    tail = b""
    if rest:
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        tail = comp.compress(zeros[:rest]) + comp.flush(zlib.Z_FULL_FLUSH)
        crc = zlib.crc32(zeros[:rest], crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no time
    last = zlib.compressobj(6, zlib.DEFLATED, -15).flush()  # an empty final block
    return (header + block * whole + tail + last
            + struct.pack("<II", crc, decompressed & 0xFFFFFFFF))


# ------------------------------------------------------------------------ HTTP/1.1

def http_request(method: str, path: str, headers: list[tuple[str, str]] = (),
                 body: bytes = b"", host: str = "127.0.0.1") -> bytes:
    """A request with exactly the headers given (plus Host): no Content-Length is
    added, so the framing headers are the caller's to get right or wrong."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def infer_json(shape: list[int], value: float = 1.0) -> bytes:
    n = 1
    for d in shape:
        n *= d
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                   "data": [value] * n}]}).encode()


def deep_json(depth: int) -> bytes:
    """An object nested `depth` deep: {"a":{"a":...}}."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def parse_status_line(data: bytes) -> int | None:
    """The status code of the first HTTP/1.x response in `data`, or None."""
    if not data.startswith(b"HTTP/1."):
        return None
    parts = data.split(b"\r\n", 1)[0].split(b" ")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None
