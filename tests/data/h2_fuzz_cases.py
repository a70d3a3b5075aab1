"""A seeded corpus of mutated HTTP/2 byte streams for the native gRPC transport, and a
runner that plays them against a live server, one connection per case.

`case(seed, i)` is deterministic (its own `random.Random((seed, i))`): a valid client
session (the preface, SETTINGS, then unary ModelInfer and ServerLive calls or a
ModelStreamInfer with two messages, some header blocks split into CONTINUATIONs) goes
through one to three mutations: bits flipped anywhere, a frame's type, flags, stream or
length changed, frames dropped, repeated or inserted (any type, unknown ones included,
with stream ids and payload sizes chosen near the edges), header blocks replaced by
random bytes, SETTINGS and WINDOW_UPDATE with random values, padding, the stream cut
short. Its bytes are sent in one to eight chunks.

`play(port, case)` sends a case and reads until the server closes the connection or
stays quiet; it returns what came back: GOAWAY codes, RST_STREAM codes, grpc-status
values and messages, and whether the server closed.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass, field

import hpack
import numpy as np
from tritonclient.grpc import service_pb2

from frontend.transport import h2

INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
MUTATIONS = ("flip", "retype", "reflag", "restream", "relength", "drop", "repeat",
             "insert", "hpack_junk", "settings", "window", "padding", "rst", "cut")


@dataclass
class Case:
    id: int
    note: str
    chunks: list[bytes]


@dataclass
class Outcome:
    goaways: list[int] = field(default_factory=list)
    resets: list[int] = field(default_factory=list)
    statuses: list[tuple[str, str]] = field(default_factory=list)  # (status, message)
    closed: bool = False
    seconds: float = 0.0


def _message(rng: random.Random) -> bytes:
    n = rng.choice([1, 16])
    req = service_pb2.ModelInferRequest(model_name="identity_fp32", inputs=[
        service_pb2.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32",
                                                      shape=[1, n])],
        raw_input_contents=[np.arange(n, dtype=np.float32).tobytes()])
    data = req.SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def _session(rng: random.Random) -> list[list]:
    """A valid client session as frames: [type, flags, stream, payload]."""
    encoder = hpack.Encoder()
    frames = [[h2.SETTINGS, 0, 0, struct.pack(">HI", h2.INITIAL_WINDOW_SIZE,
                                              rng.choice([65535, 1 << 20, 0, 100]))]]
    sid = 1
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([INFER, INFER, LIVE, STREAM])
        block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                (":authority", "x"), ("content-type", "application/grpc"),
                                ("te", "trailers")], huffman=rng.random() < 0.5)
        if rng.random() < 0.2 and len(block) > 4:  # split into CONTINUATIONs
            cut = rng.randrange(1, len(block))
            frames.append([h2.HEADERS, 0, sid, block[:cut]])
            frames.append([h2.CONTINUATION, h2.END_HEADERS, sid, block[cut:]])
        else:
            frames.append([h2.HEADERS, h2.END_HEADERS, sid, block])
        if path == LIVE:
            frames.append([h2.DATA, h2.END_STREAM, sid, b"\0\0\0\0\0"])
        elif path == INFER:
            frames.append([h2.DATA, h2.END_STREAM, sid, _message(rng)])
        else:
            frames.append([h2.DATA, 0, sid, _message(rng)])
            frames.append([h2.DATA, 0, sid, _message(rng)])
            frames.append([h2.DATA, h2.END_STREAM, sid, b""])
        sid += 2
    if rng.random() < 0.3:
        frames.append([h2.PING, 0, 0, b"fuzzping"])
    return frames


def _stream_id(rng: random.Random, frames) -> int:
    used = [f[2] for f in frames if f[2]]
    return rng.choice([0, 1, 2, 3, max(used or [1]) + 2, 2**31 - 1, rng.choice(used or [1])])


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


def _mutate(rng: random.Random, frames: list[list], kind: str) -> str:
    i = rng.randrange(1, len(frames)) if len(frames) > 1 else 0
    f = frames[i]
    if kind == "retype":
        f[0] = rng.randrange(0, 13)
        return f"frame {i} type -> {f[0]}"
    if kind == "reflag":
        f[1] = rng.getrandbits(8)
        return f"frame {i} flags -> {f[1]:#x}"
    if kind == "restream":
        f[2] = _stream_id(rng, frames)
        return f"frame {i} stream -> {f[2]}"
    if kind == "drop":
        del frames[i]
        return f"frame {i} dropped"
    if kind == "repeat":
        frames.insert(i, list(f))
        return f"frame {i} repeated"
    if kind == "insert":
        size = rng.choice([0, 1, 3, 4, 5, 6, 8, 9, rng.randrange(64)])
        new = [rng.randrange(0, 16), rng.getrandbits(8), _stream_id(rng, frames),
               _random_bytes(rng, size)]
        frames.insert(i, new)
        return f"inserted {new[:3]} with {size} bytes"
    if kind == "hpack_junk":
        heads = [g for g in frames if g[0] in (h2.HEADERS, h2.CONTINUATION)]
        g = rng.choice(heads) if heads else f
        g[3] = _random_bytes(rng, rng.randrange(1, 40))
        return "a header block of random bytes"
    if kind == "settings":
        pairs = [(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 0xFFFF]),
                  rng.choice([0, 1, 16383, 16384, 65535, 2**24, 2**31 - 1, 2**31,
                              2**32 - 1])) for _ in range(rng.randint(1, 4))]
        frames.insert(i, [h2.SETTINGS, 0, 0, b"".join(struct.pack(">HI", *p)
                                                      for p in pairs)])
        return f"SETTINGS {pairs}"
    if kind == "window":
        inc = rng.choice([0, 1, 1000, 65535, 2**31 - 1])
        frames.insert(i, [h2.WINDOW_UPDATE, 0, _stream_id(rng, frames), struct.pack(">I", inc)])
        return f"WINDOW_UPDATE {inc} on {frames[i][2]}"
    if kind == "padding":
        pad = rng.randrange(0, 256)
        f[1] |= h2.PADDED
        f[3] = bytes([pad]) + f[3] + b"\0" * rng.choice([pad, 0, pad // 2])
        return f"frame {i} padded ({pad})"
    if kind == "rst":
        frames.insert(i, [h2.RST_STREAM, 0, _stream_id(rng, frames),
                          struct.pack(">I", rng.choice([0, 1, 8, 0xFF]))])
        return f"RST_STREAM on {frames[i][2]}"
    return ""


def _serialize(frames, lie: tuple[int, int] | None = None) -> bytes:
    out = bytearray(h2.PREFACE)
    for j, (kind, flags, sid, payload) in enumerate(frames):
        length = len(payload) if lie is None or lie[0] != j else lie[1]
        out += struct.pack(">I", length)[1:] + bytes((kind & 0xFF, flags & 0xFF))
        out += struct.pack(">I", sid & 0xFFFFFFFF) + payload
    return bytes(out)


def case(seed: int, i: int) -> Case:
    rng = random.Random(seed * 1_000_003 + i)
    frames = _session(rng)
    notes = []
    lie = None
    flips = []
    cut = None
    for kind in rng.sample(MUTATIONS, rng.randint(1, 3)):
        if kind == "relength":
            j = rng.randrange(len(frames))
            lie = (j, rng.choice([0, 1, len(frames[j][3]) + 1, 2**14 + 1, 2**20 + 1,
                                  2**24 - 1, max(0, len(frames[j][3]) - 1)]))
            notes.append(f"frame {j} length says {lie[1]}")
        elif kind == "flip":
            flips.append(rng.random())
            notes.append("a bit flipped")
        elif kind == "cut":
            cut = rng.random()
            notes.append("cut short")
        else:
            notes.append(_mutate(rng, frames, kind))
    data = bytearray(_serialize(frames, lie))
    for where in flips:
        pos = 24 + int(where * (len(data) - 24))  # past the preface, mostly
        if pos < len(data):
            data[pos] ^= 1 << rng.randrange(8)
    if cut is not None:
        data = data[:max(24, int(cut * len(data)))]
    n = rng.randint(1, 8)
    points = sorted(rng.randrange(len(data) + 1) for _ in range(n - 1))
    chunks = [bytes(data[a:b]) for a, b in zip([0] + points, points + [len(data)])]
    return Case(i, "; ".join(notes), [c for c in chunks if c])


def corpus(seed: int, n: int) -> list[Case]:
    return [case(seed, i) for i in range(n)]


def play(port: int, c: Case, quiet: float = 0.1, limit: float = 10.0) -> Outcome:
    """Send the case; read until the server closes or says nothing for `quiet` s."""
    out = Outcome()
    t0 = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=limit)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = hpack.Decoder()
    buf = b""
    try:
        for chunk in c.chunks:
            sock.sendall(chunk)
        sock.settimeout(quiet)
        while time.monotonic() - t0 < limit:
            try:
                data = sock.recv(1 << 16)
            except socket.timeout:
                break
            if not data:
                out.closed = True
                break
            buf += data
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, payload = buf[3], buf[9:9 + n]
                buf = buf[9 + n:]
                if kind == h2.GOAWAY:
                    out.goaways.append(struct.unpack(">I", payload[4:8])[0])
                elif kind == h2.RST_STREAM:
                    out.resets.append(struct.unpack(">I", payload)[0])
                elif kind == h2.HEADERS:
                    fields = dict(decoder.decode(payload))
                    if "grpc-status" in fields:
                        out.statuses.append((fields["grpc-status"],
                                             fields.get("grpc-message", "")))
    except (ConnectionResetError, BrokenPipeError):
        out.closed = True
    finally:
        sock.close()
    out.seconds = time.monotonic() - t0
    return out
