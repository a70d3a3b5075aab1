"""A seeded corpus of malformed inference requests, and a runner that sends them to a
live server over HTTP (raw sockets: the lies must reach the server unchanged) and gRPC
(a channel's generic calls with identity serializers), classifying what comes back.

`corpus(seed, n)` is deterministic: case i is drawn from its own `random.Random` seeded
with (seed, i), so a case can be replayed alone (`case(seed, i)`). Each case carries its
class (CLASSES), a short note saying which lie it tells, and the outcomes it may end in:
"4xx" (any HTTP client error), "2xx" (the mutation may have left the request valid),
"closed" (the server hung up without answering, allowed where the body never arrived
whole), gRPC codes, or one exact answer ("http 501" for a Content-Encoding the server
does not speak: Triton's answer, with Accept-Encoding saying which it does). `run()`
sends the cases in order and, after every `check_every` of them, a valid request over
each protocol, recording whether it succeeded.

The models are the example repository's (examples/model_repository), which a real
Triton serves too: `identity_fp32` (FP32 [-1], batching up to 64), `add_sub` (two FP32
[16] inputs, no batching) and `string_upper` (BYTES [1], batching up to 8).
`scripts/fuzz` runs this against any server and prints cases and outcomes per class;
`tests/e2e/test_fuzz.py` runs it against shmserve in CI.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import socket
import struct
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2

FP32, ADD_SUB, BYTES = "identity_fp32", "add_sub", "string_upper"
MODELS = (FP32, ADD_SUB, BYTES)

# class -> weight in the draw (slow bodies cost ~50 ms each, so they are rarer)
CLASSES = {
    "json_malformed": 12,
    "header_length_lie": 8,
    "binary_size_lie": 8,
    "shape_bad": 10,
    "datatype_bad": 6,
    "bytes_prefix_bad": 6,
    "truncated_body": 5,
    "slow_body": 1,
    "random_bytes": 6,
    "grpc_random": 6,
    "grpc_shape_bad": 8,
    "grpc_raw_length_lie": 6,
    "grpc_datatype_bad": 5,
    "grpc_bytes_prefix_bad": 5,
    "grpc_stream": 3,
    "chunked_malformed": 3,
}

# gRPC codes that say "your request is wrong" (Triton maps its client errors to these)
GRPC_CLIENT_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE",
                               "FAILED_PRECONDITION", "UNIMPLEMENTED", "ALREADY_EXISTS"})
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_LEN = struct.Struct("<I")
_ZEROS = 80 << 20
LARGE = 70000  # FP32 values: a body over the 256 KiB a frontend reads into shared memory


@dataclass
class Case:
    """One fuzz input. `transport` is "http" (payload: the request's bytes, or for a
    slow body its pieces), "grpc" (payload: a serialized ModelInferRequest, or bytes
    that are not one) or "grpc_stream" (payload: messages sent on one stream, the last
    a valid request). `mode` for HTTP: "send", "halfclose" (send, then shut the write
    side: the body is short of its Content-Length, or the bytes are not HTTP) or "slow"
    (pieces `gap` seconds apart)."""

    id: int
    cls: str
    transport: str
    note: str
    payload: object
    allowed: frozenset
    mode: str = "send"
    gap: float = 0.0


# --------------------------------------------------------------------------- bodies

def _f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _bytes_elems(items) -> bytes:
    return b"".join(_LEN.pack(len(s)) + s for s in items)


def _words(rng: random.Random, n: int) -> list[bytes]:
    return [bytes(rng.choice(b"abcxyz") for _ in range(rng.randint(0, 6))) for _ in range(n)]


def _valid_inputs(rng: random.Random, model: str, large: bool = False) -> list[dict]:
    """A valid request's inputs, JSON form (data as lists); `large`: identity_fp32
    with LARGE values (over 256 KiB in binary form)."""
    if large:
        return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, LARGE],
                 "data": [0.0] * LARGE}]
    if model == FP32:
        b, n = rng.randint(1, 3), rng.randint(1, 6)
        return [{"name": "INPUT0", "datatype": "FP32", "shape": [b, n],
                 "data": [float(rng.randint(-9, 9)) for _ in range(b * n)]}]
    if model == ADD_SUB:
        return [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [16],
                 "data": [float(rng.randint(-9, 9)) for _ in range(16)]} for i in (0, 1)]
    b = rng.randint(1, 3)
    return [{"name": "TEXT", "datatype": "BYTES", "shape": [b, 1],
             "data": [w.decode() for w in _words(rng, b)]}]


def _raw_of(item: dict) -> bytes:
    if item["datatype"] == "BYTES":
        return _bytes_elems([s.encode() for s in item["data"]])
    return _f32(item["data"])


def _http(path: str, body: bytes, headers: dict | None = None,
          content_length: int | None = None) -> bytes:
    """An HTTP/1.1 request; `content_length` overrides (lies about) the body's length,
    and a header whose value is None is left out."""
    h = {"Host": "127.0.0.1", "Content-Type": "application/json",
         "Content-Length": str(len(body) if content_length is None else content_length)}
    h.update(headers or {})
    head = "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def _path(model: str) -> str:
    return f"/v2/models/{model}/infer"


def _json_request(model: str, doc) -> bytes:
    return _http(_path(model), json.dumps(doc).encode())


def _binary_request(model: str, inputs: list[dict], raws: list[bytes],
                    header_length=None, outputs=None) -> bytes:
    """JSON header + binary tensor data; `inputs` already carry their parameters."""
    doc = {"inputs": inputs}
    if outputs:
        doc["outputs"] = outputs
    head = json.dumps(doc).encode()
    body = head + b"".join(raws)
    ihcl = len(head) if header_length is None else header_length
    return _http(_path(model), body, {"Inference-Header-Content-Length": str(ihcl)})


def _as_binary(inputs: list[dict]) -> tuple[list[dict], list[bytes]]:
    out, raws = [], []
    for item in inputs:
        raw = _raw_of(item)
        out.append({"name": item["name"], "datatype": item["datatype"],
                    "shape": item["shape"], "parameters": {"binary_data_size": len(raw)}})
        raws.append(raw)
    return out, raws


_WEIRD_VALUES = [None, True, 0, -1, 1.5, 10**30, -(10**30), "", "x", "FP32", [], [1],
                 [[1]], {}, {"a": 1}, "\u0000", "\ud800"]


# --------------------------------------------------------------------------- HTTP classes

def _json_malformed(rng):
    model = rng.choice(MODELS)
    doc = {"inputs": _valid_inputs(rng, model)}
    text = json.dumps(doc).encode()
    kind = rng.choice(["truncate", "flip", "confuse", "confuse", "nest", "utf8",
                       "literal", "structural", "outputs", "params"])
    four = frozenset({"4xx"})
    if kind == "truncate":
        cut = rng.randrange(1, len(text))
        return f"truncated json at {cut}", _http(_path(model), text[:cut]), four
    if kind == "flip":
        pos = rng.randrange(len(text))
        new = bytes([rng.choice(b'{}[]",:0a\\ \x00\xff')])
        body = text[:pos] + new + text[pos + rng.randint(0, 1):]
        return "one byte changed", _http(_path(model), body), frozenset({"4xx", "2xx"})
    if kind == "confuse":
        item = doc["inputs"][0]
        key = rng.choice(["inputs", "name", "datatype", "shape", "data", "parameters",
                          "outputs", "id", "top_parameters"])
        value = rng.choice(_WEIRD_VALUES)
        if key == "inputs":
            if isinstance(value, list) and value == []:
                value = 5
            doc["inputs"] = value
        elif key == "outputs":
            if value in ([], None):
                value = 7
            doc["outputs"] = value if not isinstance(value, list) else [value]
        elif key == "id":
            if isinstance(value, str):
                value = 5
            doc["id"] = value
        elif key == "top_parameters":
            if isinstance(value, dict):
                value = [1]
            doc["parameters"] = value
        elif key == "parameters":
            if isinstance(value, dict):
                value = "p"
            item["parameters"] = value
            # Triton 2.51 ignores an input's "parameters" that is not an object (200)
            return f"input parameters as {type(value).__name__}", \
                _json_request(model, doc), frozenset({"4xx", "2xx"})
        else:
            if key == "datatype" and value == "FP32":
                value = "FP31"
            if key == "name" and value is None:
                value = 3
            item[key] = value
        return f"{key} as {type(value).__name__}", _json_request(model, doc), four
    if kind == "nest":
        depth = rng.choice([100, 2000, 100000])
        where = rng.choice(["data", "parameters", "shape"])
        nested = "[" * depth + "]" * depth
        body = text.replace(b'"data": [', b'"data": ' + nested.encode() + b", [", 1) \
            if where == "data" else (b'{"parameters": {"x": ' + nested.encode() + b'}, '
                                     + text[1:]) if where == "parameters" else \
            text.replace(b'"shape": [', b'"shape": [' + nested.encode() + b", ", 1)
        return f"{where} nested {depth} deep", _http(_path(model), body), four
    if kind == "utf8":
        body = text.replace(b'"INPUT0"', b'"INP\xff\xfeUT0"').replace(b'"TEXT"', b'"TE\xc3XT"')
        if model == ADD_SUB:
            body = text.replace(b'"FP32"', b'"FP\xed\xa0\x80"', 1)
        return "invalid utf-8 in a string", _http(_path(model), body), four
    if kind == "literal":
        lit = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"0x10", b"01",
                          b"1.", b".5", b"+1", b"--1", b"1e", b"tru", b"nul"])
        body = text.replace(b'"data": [', b'"data": [' + lit + b", ", 1)
        return f"literal {lit.decode()} in data", _http(_path(model), body), four
    if kind == "structural":
        body = rng.choice([b"", b"null", b"[]", b"{}", b'"s"', b"{", b"}", b"12",
                           b'{"inputs": []}', b'{"inputs": [{}]}', b'{"inputs": null}',
                           b'{"inputs": [null]}', b'{"inputs": [[]]}',
                           b'{"inputs": [{"name": "INPUT0"}]}',
                           b'{"inputs": {"name": "INPUT0"}}', b"\x00" * 8,
                           b'{"inputs": [], "inputs": []}', b"{,}", b'{"a" 1}'])
        return f"structural {body[:24]!r}", _http(_path(model), body), four
    if kind == "outputs":
        out = rng.choice([[{"name": "NOPE"}], [{"name": 5}], [{}], [None], [[]],
                          [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}],
                          [{"name": "OUTPUT0", "parameters": {"classification": -3}}],
                          [{"name": "OUTPUT0", "parameters": {"classification": "x"}}],
                          [{"name": "OUTPUT0", "parameters": 5}]])
        doc["outputs"] = out
        return f"outputs {json.dumps(out)[:40]}", _json_request(model, doc), four
    params = rng.choice([{"sequence_id": "x" * 300}, {"sequence_id": 1.5},
                         {"sequence_id": []}, {"priority": "high"}, {"priority": -1},
                         {"priority": 2**70}, {"timeout": -5}, {"timeout": "soon"},
                         {"binary_data_output": "yes"}, {"sequence_start": "yes"},
                         {"sequence_end": 2}, {"shared_memory_region": 5},
                         {"x": {"nested": 1}}])
    doc["parameters"] = params
    return f"parameters {json.dumps(params)[:40]}", _json_request(model, doc), \
        frozenset({"4xx", "2xx"})


def _header_length_lie(rng):
    model = rng.choice(MODELS)
    large = rng.random() < 0.15
    inputs, raws = _as_binary(_valid_inputs(rng, model, large))
    model = FP32 if large else model
    head = json.dumps({"inputs": inputs}).encode()
    total = len(head) + sum(map(len, raws))
    lie = rng.choice([len(head) + rng.randint(1, 64), len(head) - rng.randint(1, 20),
                      total + rng.randint(1, 1000), 1, -1, -len(head), 2**31, 2**63,
                      2**64 + len(head), "abc", "", " 12", "1e3", "0x10", "12abc",
                      f"{len(head)}.0", f"+{len(head)}", f"{len(head)}, {len(head)}"])
    # "+N" is N, told oddly (Triton and Python's int() both read it): not a lie
    four = frozenset({"4xx", "2xx"} if lie == f"+{len(head)}" else {"4xx"})
    return f"Inference-Header-Content-Length {lie!r} for {len(head)}", \
        _binary_request(model, inputs, raws, header_length=lie), four


def _binary_size_lie(rng):
    model = rng.choice(MODELS)
    large = rng.random() < 0.15
    inputs, raws = _as_binary(_valid_inputs(rng, model, large))
    model = FP32 if large else model
    k = rng.randrange(len(inputs))
    true = inputs[k]["parameters"]["binary_data_size"]
    kind = rng.choice(["declared", "declared", "sent", "type", "both", "swap"])
    if kind == "declared":
        lie = rng.choice([true + rng.randint(1, 8), max(0, true - rng.randint(1, 8)),
                          0, -1, -true, 2**32 + true, 2**63, 2**64])
        if lie == true:
            lie = true + 4
        inputs[k]["parameters"]["binary_data_size"] = lie
        note = f"binary_data_size {lie} for {true} bytes"
    elif kind == "sent":
        cut = rng.choice([-1, -3, 1, 5])
        raws[k] = raws[k][:cut] if cut < 0 else raws[k] + os.urandom(cut)
        note = f"binary_data_size {true}, {len(raws[k])} bytes sent"
    elif kind == "type":
        lie = rng.choice([str(true), float(true) + 0.5, None, [true], {"n": true}, True])
        inputs[k]["parameters"]["binary_data_size"] = lie
        note = f"binary_data_size as {type(lie).__name__}"
    elif kind == "both":
        inputs[k]["data"] = [0.0]
        note = "binary_data_size and data both"
    else:
        if len(inputs) == 2:  # the total is right, each input's share is wrong
            inputs[0]["parameters"]["binary_data_size"] = true - 4
            inputs[1]["parameters"]["binary_data_size"] = true + 4
            note = "binary_data_size shares swapped"
        else:
            raws.append(b"\0" * 8)
            note = "8 bytes more than the inputs claim"
    return note, _binary_request(model, inputs, raws), frozenset({"4xx"})


_HUGE = [2**31, 2**32, 2**40, 2**62, 2**63 - 1]


def _bad_shape(rng, model: str) -> tuple[str, list]:
    """A shape that is wrong for `model`'s first input (int64 values only)."""
    choices = [[rng.choice(_HUGE)], [1, rng.choice(_HUGE)], [2**31, 2**31, 2**31],
               [rng.choice([-1, -2, -(2**63)])], [1, -1], [-1, 4], [], [0, 2**40]]
    if model == FP32:
        choices += [[65, 1], [1, 2, 3], [1] * 70, [2**20, 1]]
    elif model == ADD_SUB:
        choices += [[15], [17], [1, 16], [4, 4], [0]]
    else:
        choices += [[9, 1], [1, 2], [1], [1, 1, 1], [2**33, 1]]
    shape = rng.choice(choices)
    return f"shape {shape}", shape


def _shape_bad(rng):
    model = rng.choice(MODELS)
    inputs = _valid_inputs(rng, model)
    four = frozenset({"4xx"})
    kind = rng.choice(["json", "json", "binary", "type", "pair"])
    if kind == "type":
        inputs[0]["shape"] = rng.choice([[1.5], ["1"], [None], [[1]], [True], [2**64],
                                         [-(2**63) - 1], [1e300], "16", 16, None, {}])
        return f"shape {json.dumps(inputs[0]['shape'])[:30]}", \
            _json_request(model, {"inputs": inputs}), four
    if kind == "pair" and model == ADD_SUB:
        inputs[1]["shape"] = [8]
        inputs[1]["data"] = inputs[1]["data"][:8]
        return "INPUT1 shape [8], INPUT0 [16]", _json_request(model, {"inputs": inputs}), four
    note, shape = _bad_shape(rng, model)
    inputs[0]["shape"] = shape
    if kind == "binary":
        binputs, raws = _as_binary(inputs)
        binputs[0]["shape"] = shape
        return note + " (binary)", _binary_request(model, binputs, raws), four
    return note, _json_request(model, {"inputs": inputs}), four


def _datatype_bad(rng):
    model = rng.choice(MODELS)
    inputs = _valid_inputs(rng, model)
    four = frozenset({"4xx"})
    item = inputs[0]
    n = len(item["data"])
    if model == BYTES:
        dt, data = rng.choice([("FP32", [1.0] * n), ("INT8", [1] * n), ("bytes", item["data"]),
                               ("BYTES", [1] * n), ("BYTES", [None] * n),
                               ("BYTES", [[]] * n), ("STRING", item["data"]),
                               ("BYTES", [{"b64": "AA=="}] * n)])
    else:
        dt, data = rng.choice([("FP33", item["data"]), ("fp32", item["data"]),
                               ("", item["data"]), ("INT32", [1] * n), ("FP64", item["data"]),
                               ("FP16", item["data"]), ("BF16", item["data"]),
                               ("BYTES", ["a"] * n), ("BOOL", [True] * n),
                               ("UINT64", [2**64 - 1] * n), ("FP32", ["1.0"] * n),
                               ("FP32", [None] * n), ("FP32", [True] * n),
                               ("TYPE_FP32", item["data"])])
    item["datatype"], item["data"] = dt, data
    if rng.random() < 0.3 and dt in ("FP16", "BF16", "INT32", "FP64", "BOOL"):
        size = {"FP16": 2, "BF16": 2, "INT32": 4, "FP64": 8, "BOOL": 1}[dt] * n
        item.pop("data")
        item["parameters"] = {"binary_data_size": size}
        return f"datatype {dt} (binary)", _binary_request(model, inputs, [b"\1" * size]), four
    return f"datatype {dt!r} data {json.dumps(data[:1])}", \
        _json_request(model, {"inputs": inputs}), four


def _bad_bytes_elems(rng, shape_count: int) -> tuple[str, bytes]:
    """BYTES serialization whose length prefixes lie (or count the wrong elements)."""
    words = _words(rng, shape_count)
    good = _bytes_elems(words)
    kind = rng.choice(["long", "huge", "cut_prefix", "trailing", "fewer", "more", "empty"])
    if kind == "long":
        last = words[-1]
        return "last prefix too long", good[:len(good) - len(last) - 4] + \
            _LEN.pack(len(last) + rng.randint(1, 50)) + last
    if kind == "huge":
        return "prefix 0xffffffff", _LEN.pack(0xFFFFFFFF) + good
    if kind == "cut_prefix":
        return "a prefix cut short", good + _LEN.pack(3)[:rng.randint(1, 3)]
    if kind == "trailing":
        return "bytes after the last element", good + _LEN.pack(1) + b"z"
    if kind == "fewer":
        return "one element fewer than the shape", _bytes_elems(words[:-1])
    if kind == "more":
        return "one element more than the shape", good + _bytes_elems([b"extra"])
    return "no bytes at all", b""


def _bytes_prefix_bad(rng):
    b = rng.randint(1, 3)
    note, raw = _bad_bytes_elems(rng, b)
    inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [b, 1],
               "parameters": {"binary_data_size": len(raw)}}]
    return note, _binary_request(BYTES, inputs, [raw]), frozenset({"4xx"})


def _valid_http(rng, large_ok: bool = False) -> tuple[str, bytes]:
    model = rng.choice(MODELS)
    if large_ok and rng.random() < 0.2:
        binputs, raws = _as_binary(_valid_inputs(rng, FP32, True))
        return f"{FP32} binary {len(raws[0])} bytes", _binary_request(FP32, binputs, raws)
    inputs = _valid_inputs(rng, model)
    if rng.random() < 0.5:
        return f"{model} json", _json_request(model, {"inputs": inputs})
    binputs, raws = _as_binary(inputs)
    return f"{model} binary", _binary_request(model, binputs, raws)


def _split_request(data: bytes) -> tuple[bytes, bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", body


def _truncated_body(rng):
    note, data = _valid_http(rng, large_ok=True)
    head, body = _split_request(data)
    kind = rng.choice(["short", "claims_more", "chunked", "short_length"])
    if kind == "short":  # Content-Length right, part of the body sent, then EOF
        cut = rng.randrange(0, len(body))
        return f"{note}: {cut} of {len(body)} bytes, then EOF", head + body[:cut], \
            frozenset({"4xx", "closed"}), "halfclose"
    if kind == "claims_more":
        extra = rng.choice([1, 100, 10**6, 10**9])
        lied = head.replace(b"Content-Length: %d" % len(body),
                            b"Content-Length: %d" % (len(body) + extra))
        # over the 64 MiB input limit, a server refuses at once and closes with the
        # body unread: its answer may be lost to the reset that closing then sends
        return f"{note}: Content-Length {extra} over the body, then EOF", lied + body, \
            frozenset({"4xx", "closed"} | ({"reset"} if extra > 1 << 26 else set())), \
            "halfclose"
    if kind == "chunked":
        lied = head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked")
        cut = rng.randrange(0, len(body))
        chunk = b"%x\r\n" % len(body) + body[:cut]
        return f"{note}: chunked, cut at {cut} of {len(body)}, then EOF", lied + chunk, \
            frozenset({"4xx", "closed"}), "halfclose"
    short = rng.randrange(0, len(body))  # the rest is left as the next "request"
    lied = head.replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % short)
    return f"{note}: Content-Length {short} of {len(body)}", lied + body, \
        frozenset({"4xx"}), "send"


# a chunk's framing broken one way or another: each is a request httptools refuses
# mid-body (issue 25: such bodies got no answer and their connections hung)
_CHUNK_LIES = {
    "size not hex": lambda n, rng: b"%s\r\n" % rng.choice(
        [b"zz", b"-%x" % n, b"0x%x" % n, b"%x %x" % (n, n), b"", b"+%x" % n, b"%x\x00" % n]),
    "size past 2^64": lambda n, rng: b"%s\r\n" % rng.choice(
        [b"1" + b"0" * 16, b"f" * 17, b"%x" % (2**64 + n), b"0" * 30 + b"1" + b"0" * 16]),
    "extension with a bare CR or LF": lambda n, rng: b"%x;%s\r\n" % (n, rng.choice(
        [b"a\nb", b"a\rb", b"\n", b"x=\"\r\""])),
    "size line ends in a bare LF": lambda n, rng: b"%x\n" % n,
}


def _chunked_malformed(rng):
    note, data = _valid_http(rng)
    head, body = _split_request(data)
    head = head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked")
    n = rng.randint(1, 4)
    cuts = sorted(rng.sample(range(1, len(body)), min(n - 1, len(body) - 1)))
    parts = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
    chunks = [[b"%x\r\n" % len(p), p, b"\r\n"] for p in parts] + [[b"0\r\n", b"", b"\r\n"]]
    k = rng.randrange(len(parts))  # the chunk that lies
    kind = rng.choice(list(_CHUNK_LIES) + ["no CRLF after the data", "bad trailer",
                                           "huge chunk that never comes"])
    mode = "send"
    if kind in _CHUNK_LIES:
        chunks[k][0] = _CHUNK_LIES[kind](len(parts[k]), rng)
    elif kind == "no CRLF after the data":
        chunks[k][2] = rng.choice([b"", b"XY", b"\n", b"\r"])
    elif kind == "bad trailer":
        chunks[-1][2] = rng.choice([b"no colon\r\n\r\n", b" x: folded\r\n\r\n",
                                    b"x y: z\r\n\r\n"])
    else:  # the size is fine, the body never arrives: the client gives up (EOF)
        chunks[k][0] = b"%x\r\n" % rng.choice([2**60, 2**64 - 1, 1 << 40])
        chunks = chunks[:k + 1]
        mode = "halfclose"
    # a server may close at the broken chunk before the rest of the bytes arrive:
    # then the kernel resets the connection, which may reach the client first
    return f"{note}: chunked, chunk {k} of {len(parts)}: {kind}", \
        head + b"".join(b"".join(c) for c in chunks), \
        frozenset({"4xx", "closed", "reset"}), mode


def _slow_body(rng):
    if rng.random() < 0.5:
        note, data = _valid_http(rng)
        allowed = frozenset({"2xx"})
    else:
        note, data, allowed = _json_malformed(rng)
    head, body = _split_request(data)
    n = rng.randint(3, 6)
    cuts = sorted(rng.sample(range(1, max(len(body), n + 1)), n - 1))
    pieces = [head] + [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
    if rng.random() < 0.3:  # the request line and headers trickle too
        mid = rng.randrange(1, len(head))
        pieces = [head[:mid], head[mid:]] + pieces[1:]
    return f"slow: {note}", [p for p in pieces if p], allowed


def _random_bytes(rng):
    kind = rng.choice(["body", "body", "binary", "stream", "http_line", "encoding"])
    n = rng.randint(0, 400)
    junk = bytes(rng.getrandbits(8) for _ in range(n))
    model = rng.choice(MODELS)
    if kind == "encoding":
        return _bad_encoding(rng, model, junk) + ("send",)
    if kind == "body":
        return f"{n} random bytes as the body", _http(_path(model), junk), \
            frozenset({"4xx"}), "send"
    if kind == "binary":
        ihcl = rng.randint(0, n)
        return f"{n} random bytes, header length {ihcl}", \
            _http(_path(model), junk, {"Inference-Header-Content-Length": str(ihcl)}), \
            frozenset({"4xx", "2xx"} if ihcl == 0 else {"4xx"}), "send"
    if kind == "stream":  # not HTTP at all
        return f"{n} random bytes on the connection", junk, \
            frozenset({"4xx", "closed"}), "halfclose"
    line = rng.choice([b"POST /v2/models/%s/infer HTTP/1.1\r\n" % model.encode(),
                       b"POST /v2/models/%s/infer HTTP/9.9\r\n" % model.encode(),
                       b"GET /v2/models/%s/infer HTTP/1.1\r\n" % model.encode()])
    return f"request line then {n} random bytes", line + junk + b"\r\n\r\n", \
        frozenset({"4xx", "closed"}), "halfclose"


@functools.cache
def _bomb(encoding: str) -> bytes:
    zeros = bytes(_ZEROS)
    return gzip.compress(zeros, 9) if encoding == "gzip" else zlib.compress(zeros, 9)


def _bad_encoding(rng, model: str, junk: bytes):
    """A Content-Encoding the body does not live up to (or that no one speaks)."""
    body = json.dumps({"inputs": _valid_inputs(rng, model)}).encode()
    kind = rng.choice(["junk", "cut", "bomb", "unknown"])
    if kind == "junk":
        enc, data = rng.choice(["gzip", "deflate"]), junk
    elif kind == "cut":
        enc = rng.choice(["gzip", "deflate"])
        whole = gzip.compress(body) if enc == "gzip" else zlib.compress(body)
        data = whole[:rng.randrange(1, len(whole))]
    elif kind == "bomb":  # 80 MiB of zeros in ~80 KiB: past the 64 MiB input limit
        enc = rng.choice(["gzip", "deflate"])
        data = _bomb(enc)
    else:  # 501 with Accept-Encoding: the server lacks the coding (Triton's answer)
        enc, data = rng.choice(["br", "zstd", "gzip, br", "x-nope"]), body
        return f"Content-Encoding {enc}: {kind}", \
            _http(_path(model), data, {"Content-Encoding": enc}), frozenset({"http 501"})
    return f"Content-Encoding {enc}: {kind}", \
        _http(_path(model), data, {"Content-Encoding": enc}), frozenset({"4xx"})


# --------------------------------------------------------------------------- gRPC classes

def _proto_inputs(inputs: list[dict]) -> tuple[list, list[bytes]]:
    tensors = [service_pb2.ModelInferRequest.InferInputTensor(
        name=i["name"], datatype=i["datatype"], shape=i["shape"]) for i in inputs]
    return tensors, [_raw_of(i) for i in inputs]


def _valid_proto(rng, model: str | None = None, rid: str = "") -> service_pb2.ModelInferRequest:
    model = model or rng.choice(MODELS)
    tensors, raws = _proto_inputs(_valid_inputs(rng, model))
    return service_pb2.ModelInferRequest(model_name=model, id=rid, inputs=tensors,
                                         raw_input_contents=raws)


def _grpc_random(rng):
    n = rng.randint(0, 300)
    junk = bytes(rng.getrandbits(8) for _ in range(n))
    kind = rng.choice(["junk", "junk", "named", "cut", "flip"])
    if kind == "named":  # a valid model_name field, then garbage
        name = rng.choice(MODELS).encode()
        return f"model_name then {n} random bytes", b"\n" + bytes([len(name)]) + name + junk, \
            GRPC_CLIENT_CODES
    wire = _valid_proto(rng).SerializeToString()
    if kind == "cut":
        cut = rng.randrange(1, len(wire))
        return f"valid message cut at {cut} of {len(wire)}", wire[:cut], \
            GRPC_CLIENT_CODES | {"OK"}
    if kind == "flip":
        pos = rng.randrange(len(wire))
        flipped = wire[:pos] + bytes([wire[pos] ^ (1 << rng.randrange(8))]) + wire[pos + 1:]
        return f"bit flipped at {pos}", flipped, GRPC_CLIENT_CODES | {"OK"}
    return f"{n} random bytes", junk, GRPC_CLIENT_CODES


def _grpc_shape_bad(rng):
    model = rng.choice(MODELS)
    msg = _valid_proto(rng, model)
    note, shape = _bad_shape(rng, model)
    del msg.inputs[0].shape[:]
    msg.inputs[0].shape.extend(shape)
    if model == ADD_SUB and rng.random() < 0.3:
        del msg.inputs[1].shape[:]
        msg.inputs[1].shape.extend([4, 4])
        note = "INPUT1 shape [4, 4]"
    return note, msg.SerializeToString(), GRPC_CLIENT_CODES


def _grpc_raw_length_lie(rng):
    model = rng.choice(MODELS)
    msg = _valid_proto(rng, model)
    raws = list(msg.raw_input_contents)
    k = rng.randrange(len(raws))
    kind = rng.choice(["short", "long", "empty", "extra", "missing", "contents_too"])
    if kind == "short":
        raws[k] = raws[k][:-rng.randint(1, min(4, len(raws[k])))] if raws[k] else b""
        if model == BYTES and not raws[k]:
            raws[k] = b"\1"
    elif kind == "long":
        raws[k] = raws[k] + b"\0" * rng.randint(1, 9)
    elif kind == "empty":
        raws[k] = b""
    elif kind == "extra":
        raws.append(b"\0" * 4)
    elif kind == "missing":
        raws.pop()
    del msg.raw_input_contents[:]
    msg.raw_input_contents.extend(raws)
    if kind == "contents_too":
        if model == BYTES:
            msg.inputs[k].contents.bytes_contents.append(b"x")
        else:
            msg.inputs[k].contents.fp32_contents.extend([1.0] * 4)
    if kind == "empty" and model == BYTES and msg.inputs[k].shape[0] == 1:
        pass  # zero bytes for one element: still wrong (no length prefix)
    return f"raw_input_contents {kind} (input {k})", msg.SerializeToString(), GRPC_CLIENT_CODES


def _grpc_datatype_bad(rng):
    model = rng.choice(MODELS)
    msg = _valid_proto(rng, model)
    t = msg.inputs[0]
    kind = rng.choice(["name", "name", "contents", "contents_count"])
    if kind == "name":
        dt = rng.choice(["FP33", "fp32", "", "INT32", "FP64", "FP16", "BYTES", "TYPE_FP32",
                         "BOOL", "\xff"]) if model != BYTES else \
            rng.choice(["FP32", "INT8", "bytes", "STRING", "", "UINT8"])
        t.datatype = dt
        return f"datatype {dt!r}", msg.SerializeToString(), GRPC_CLIENT_CODES
    count = 1
    for d in t.shape:
        count *= d
    del msg.raw_input_contents[:]
    if kind == "contents":  # typed contents in the wrong field for the datatype
        field_name = rng.choice(["int_contents", "int64_contents", "bool_contents",
                                 "fp64_contents", "uint_contents",
                                 "bytes_contents" if model != BYTES else "fp32_contents"])
        values = {"bool_contents": [True], "bytes_contents": [b"x"]}.get(
            field_name, [1])
        for tensor in msg.inputs:
            getattr(tensor.contents, field_name).extend(values * count)
        return f"contents in {field_name}", msg.SerializeToString(), GRPC_CLIENT_CODES
    off = rng.choice([-1, 1, 5])
    for tensor in msg.inputs:
        if model == BYTES:
            tensor.contents.bytes_contents.extend([b"x"] * max(0, count + off))
        else:
            tensor.contents.fp32_contents.extend([1.0] * max(0, count + off))
    return f"contents count {off:+d}", msg.SerializeToString(), GRPC_CLIENT_CODES


def _grpc_bytes_prefix_bad(rng):
    b = rng.randint(1, 3)
    note, raw = _bad_bytes_elems(rng, b)
    t = service_pb2.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES",
                                                      shape=[b, 1])
    msg = service_pb2.ModelInferRequest(model_name=BYTES, inputs=[t], raw_input_contents=[raw])
    return note, msg.SerializeToString(), GRPC_CLIENT_CODES


_GRPC_BAD = (_grpc_random, _grpc_shape_bad, _grpc_raw_length_lie, _grpc_datatype_bad,
             _grpc_bytes_prefix_bad)


def _grpc_stream(rng):
    """One bad message, then a valid one, on a stream: the error must come back as the
    bad message's response and the stream must go on serving."""
    gen = rng.choice(_GRPC_BAD[1:])  # random bytes may not parse: the error has no id
    note, bad, _ = gen(rng)
    good = _valid_proto(rng, rid="good").SerializeToString()
    return f"stream: {gen.__name__[6:]}: {note}", [bad, good], frozenset({"stream error,ok"})


_HTTP_GENERATORS = {
    "json_malformed": _json_malformed, "header_length_lie": _header_length_lie,
    "binary_size_lie": _binary_size_lie, "shape_bad": _shape_bad,
    "datatype_bad": _datatype_bad, "bytes_prefix_bad": _bytes_prefix_bad,
}
_GRPC_GENERATORS = {
    "grpc_random": _grpc_random, "grpc_shape_bad": _grpc_shape_bad,
    "grpc_raw_length_lie": _grpc_raw_length_lie, "grpc_datatype_bad": _grpc_datatype_bad,
    "grpc_bytes_prefix_bad": _grpc_bytes_prefix_bad,
}


def case(seed: int, i: int) -> Case:
    """Case `i` of the corpus for `seed` (independent of every other case)."""
    rng = random.Random(f"shmserve-fuzz:{seed}:{i}")
    cls = rng.choices(list(CLASSES), weights=list(CLASSES.values()))[0]
    if cls in _HTTP_GENERATORS:
        note, data, allowed = _HTTP_GENERATORS[cls](rng)
        return Case(i, cls, "http", note, data, allowed)
    if cls in ("truncated_body", "random_bytes", "chunked_malformed"):
        gen = {"truncated_body": _truncated_body, "random_bytes": _random_bytes,
               "chunked_malformed": _chunked_malformed}[cls]
        note, data, allowed, mode = gen(rng)
        return Case(i, cls, "http", note, data, allowed, mode)
    if cls == "slow_body":
        note, pieces, allowed = _slow_body(rng)
        return Case(i, cls, "http", note, pieces, allowed, "slow", rng.uniform(0.005, 0.015))
    if cls in _GRPC_GENERATORS:
        note, data, allowed = _GRPC_GENERATORS[cls](rng)
        return Case(i, cls, "grpc", note, data, allowed)
    note, messages, allowed = _grpc_stream(rng)
    return Case(i, cls, "grpc_stream", note, messages, allowed)


def corpus(seed: int, n: int) -> list[Case]:
    return [case(seed, i) for i in range(n)]


# --------------------------------------------------------------------------- running

@dataclass
class Outcome:
    """What one case ended in: `kind` is "http 400", "closed", "reset", "timeout",
    "grpc INVALID_ARGUMENT", "stream error,ok", ...; `message` the error text. A case
    allows it when its `allowed` names the kind or its group."""

    kind: str
    message: str = ""
    seconds: float = 0.0

    def group(self) -> str:
        """The kind as the case's `allowed` set names it ("4xx", "2xx", a gRPC code)."""
        if self.kind.startswith("http "):
            return self.kind[5] + "xx"
        if self.kind.startswith("grpc "):
            return self.kind[5:]
        return self.kind


def _read_response(sock: socket.socket, deadline: float) -> Outcome:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                return Outcome("closed" if not data else "garbled", data[:80].decode("latin-1"))
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                       if k.strip().lower() == "content-length"), None)
        while length is not None and len(body) < length:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except socket.timeout:
        return Outcome("timeout", data[:80].decode("latin-1"))
    except (ConnectionResetError, BrokenPipeError):
        return Outcome("reset" if not data else "garbled", data[:80].decode("latin-1"))
    message = ""
    if status >= 300:
        try:
            message = json.loads(body).get("error", "")
        except ValueError:
            message = body[:200].decode("latin-1")
    return Outcome(f"http {status}", str(message)[:300])


def _http_case(c: Case, host: str, port: int, timeout: float) -> Outcome:
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            if c.mode == "slow":
                for k, piece in enumerate(c.payload):
                    if k:
                        time.sleep(c.gap)  # the trickle is the input, not a wait
                    sock.sendall(piece)
            else:
                sock.sendall(c.payload)
                if c.mode == "halfclose":
                    sock.shutdown(socket.SHUT_WR)
        except OSError:  # reset, broken pipe, not connected (ENOTCONN on shutdown)
            pass  # the server answered (or hung up) before reading all: read what it said
        return _read_response(sock, deadline)


def _grpc_code(e: grpc.RpcError) -> str:
    code = e.code()
    return code.name if code is not None else "UNKNOWN"


def _grpc_case(c: Case, channel: grpc.Channel, timeout: float) -> Outcome:
    call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    try:
        call(c.payload, timeout=timeout)
        return Outcome("grpc OK")
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome("timeout", e.details() or "")
        return Outcome(f"grpc {_grpc_code(e)}", (e.details() or "")[:300])


def _grpc_stream_case(c: Case, channel: grpc.Channel, timeout: float) -> Outcome:
    call = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)
    answers, message = [], ""
    try:
        for reply in call(iter(c.payload), timeout=timeout):
            r = service_pb2.ModelStreamInferResponse.FromString(reply)
            answers.append("error" if r.error_message else "ok")
            message = message or r.error_message
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome("timeout", ",".join(answers))
        return Outcome(f"stream {','.join(answers)} then {_grpc_code(e)}",
                       (e.details() or "")[:300])
    # the valid message answers "ok"; an error for the bad one is listed first
    return Outcome(f"stream {','.join(sorted(answers))}", message[:300])


def run_case(c: Case, host: str, http_port: int, channel: grpc.Channel,
             timeout: float = 10.0) -> Outcome:
    start = time.monotonic()
    try:
        if c.transport == "http":
            out = _http_case(c, host, http_port, timeout)
        elif c.transport == "grpc":
            out = _grpc_case(c, channel, timeout)
        else:
            out = _grpc_stream_case(c, channel, timeout)
    except ConnectionRefusedError as e:
        out = Outcome("refused", str(e))
    except socket.timeout:
        out = Outcome("timeout")
    out.seconds = round(time.monotonic() - start, 4)
    return out


def check_valid(host: str, http_port: int, channel: grpc.Channel,
                timeout: float = 10.0) -> list[str]:
    """A valid request over each protocol; the list of what failed (empty: all good)."""
    failures = []
    values = [float(v) for v in range(8)]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 8],
                                   "data": values}]}).encode()
    out = _http_case(Case(-1, "check", "http", "", _http(_path(FP32), body), frozenset()),
                     host, http_port, timeout)
    if out.kind != "http 200":
        failures.append(f"http {FP32}: {out.kind} {out.message}")
    t = service_pb2.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES",
                                                      shape=[1, 1])
    msg = service_pb2.ModelInferRequest(model_name=BYTES, inputs=[t],
                                        raw_input_contents=[_bytes_elems([b"abc"])])
    call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
    try:
        reply = service_pb2.ModelInferResponse.FromString(
            call(msg.SerializeToString(), timeout=timeout))
        if reply.raw_output_contents[0] != _bytes_elems([b"ABC"]):
            failures.append(f"grpc {BYTES}: wrong answer {reply.raw_output_contents[0]!r}")
    except grpc.RpcError as e:
        failures.append(f"grpc {BYTES}: {_grpc_code(e)} {e.details()}")
    return failures


@dataclass
class Report:
    """A run's results: per case (id, class, note, outcome, message, allowed?) and the
    valid-request checks made after every chunk of cases."""

    seed: int
    results: list[dict] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    unsent: int = 0

    def per_class(self) -> dict[str, Counter]:
        table: dict[str, Counter] = {}
        for r in self.results:
            table.setdefault(r["cls"], Counter())[r["outcome"]] += 1
        return {cls: table[cls] for cls in CLASSES if cls in table}

    def unexpected(self) -> list[dict]:
        return [r for r in self.results if not r["allowed"]]

    def failed_checks(self) -> list[dict]:
        return [c for c in self.checks if c["failures"]]

    def to_json(self) -> dict:
        return {"seed": self.seed, "cases": len(self.results), "unsent": self.unsent,
                "seconds": self.seconds,
                "per_class": {k: dict(v) for k, v in self.per_class().items()},
                "checks": self.checks, "results": self.results}


def server_alive(host: str, http_port: int) -> bool:
    """Whether anything still listens on the HTTP port."""
    try:
        socket.create_connection((host, http_port), timeout=2).close()
        return True
    except OSError:
        return False


_SUSPECT = ("closed", "reset", "refused", "garbled", "timeout", "grpc UNAVAILABLE",
            "grpc UNKNOWN", "grpc INTERNAL")


def _record(c: Case, out: Outcome) -> dict:
    return {"id": c.id, "cls": c.cls, "note": c.note, "outcome": out.kind,
            "message": out.message,
            "allowed": out.group() in c.allowed or out.kind in c.allowed,
            "seconds": out.seconds}


def run(cases: list[Case], host: str, http_port: int, grpc_port: int, *,
        check_every: int = 100, timeout: float = 10.0, seed: int = 0,
        on_chunk=None, revive=None, skip=(), budget: float | None = None) -> Report:
    """Send `cases` in order; after every `check_every` (and at the end) a valid request
    over each protocol. `on_chunk(report)` is called after each check (a test checks
    the server's processes there). Cases in `skip` (ids) are recorded as "skipped".

    When the server no longer listens after a case, the run stops there (the case is
    recorded as "server died") unless `revive` is given: then `revive()` must bring the
    server back, and the case and the one before it are replayed, one at a time, to
    find which one kills it (a server may answer, or hang up, and die a moment later);
    that one is recorded as "server died", the other with its replayed outcome. With
    `revive`, a case that ends in a suspect outcome (a hang-up, a timeout, gRPC
    UNAVAILABLE, INTERNAL or UNKNOWN) is followed by the valid requests; if they fail,
    the case is recorded as "server broken" and the server is revived. With `budget`
    (seconds), cases left when it is spent are not sent (`Report.unsent` counts them)."""
    report = Report(seed)
    start = time.monotonic()
    channel = grpc.insecure_channel(f"{host}:{grpc_port}")

    def send(c: Case) -> tuple[Outcome, bool]:
        out = Outcome("skipped") if c.id in skip else run_case(c, host, http_port,
                                                                channel, timeout)
        return out, out.kind.startswith(_SUSPECT) and not server_alive(host, http_port)

    def reopen() -> None:
        nonlocal channel
        revive()
        channel.close()
        channel = grpc.insecure_channel(f"{host}:{grpc_port}")
        deadline = time.monotonic() + 60  # until both protocols serve (a bound)
        while _failures() and time.monotonic() < deadline:
            time.sleep(0.2)

    def _failures() -> list[str]:
        try:
            return check_valid(host, http_port, channel, timeout)
        except OSError as e:
            return [f"{type(e).__name__}: {e}"]

    try:
        for k, c in enumerate(cases, 1):
            if budget is not None and time.monotonic() - start > budget:
                report.unsent = len(cases) - k + 1
                break
            out, died = send(c)
            if died and revive is not None:
                reopen()
                suspects = [(k - 1, c)] + ([(k - 2, cases[k - 2])] if k > 1 else [])
                killer = None
                for index, suspect in suspects:
                    replay, again = send(suspect)
                    if again:
                        killer = index
                        reopen()
                        break
                    if index == k - 1:
                        out = replay
                if killer == k - 2:
                    prev = report.results[-1]
                    prev["message"] = f"{prev['outcome']} {prev['message']}"[:300]
                    prev["outcome"], prev["allowed"] = "server died", False
                    died = False
                elif killer is None:  # not reproduced alone: the first answer stands
                    out.message = f"(server died after it, not on replay) {out.message}"
                    died = False
            if died:
                out = Outcome("server died", f"{out.kind} {out.message}"[:300], out.seconds)
            elif revive is not None and out.kind.startswith(_SUSPECT):
                # alive, but does it still serve? (a model instance may have died, or
                # the server may have been dying while the probe above connected)
                failures = _failures()
                if failures:
                    kind = "server broken" if server_alive(host, http_port) else \
                        "server died"
                    out = Outcome(kind, f"{out.kind} {out.message}; then "
                                  f"{'; '.join(failures)}"[:300], out.seconds)
                    reopen()
            report.results.append(_record(c, out))
            if died and revive is None:
                break
            if k % check_every == 0 or k == len(cases):
                try:
                    failures = check_valid(host, http_port, channel, timeout)
                except OSError as e:
                    failures = [f"{type(e).__name__}: {e}"]
                report.checks.append({"after": k, "failures": failures})
                if on_chunk is not None:
                    on_chunk(report)
    finally:
        channel.close()
    report.seconds = round(time.monotonic() - start, 2)
    return report
