"""KServe v2 gRPC inference messages (Triton's `ModelInferRequest` / `ModelInferResponse`).

Pure functions, no I/O. `decode_infer_request` turns a serialized ModelInferRequest
into a `DecodedRequest`; `encode_infer_response` / `encode_stream_response` turn an
`InferResult` into a serialized ModelInferResponse / ModelStreamInferResponse.

The server hands these functions wire bytes, not parsed messages, because protobuf
(upb) copies every bytes field twice (into its arena, then into a new Python object)
and runs at ~0.3 GB/s on a cold 64 MiB message. Large requests are therefore split
here: `raw_input_contents` (field 7) become memoryview slices of the received bytes
and only the remaining small fields go through protobuf. Responses are likewise built
with protobuf for everything but `raw_output_contents` (field 6), whose entries are
appended as wire bytes, so each output is copied exactly once, into the reply.

Error texts follow Triton's grpc infer handler (they are what tritonclient users see).
"""

from __future__ import annotations

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from shm.datatypes import element_size, is_known
from shm.errors import GRPC_STATUS, ErrorCode, InferError

from .types import (CORRELATION_ID_MAX, CORRELATION_ID_TOO_LONG, DecodedInput,
                    DecodedRequest, InferResult, RequestedOutput)

ModelInferRequest = service_pb2.ModelInferRequest
ModelInferResponse = service_pb2.ModelInferResponse

_INVALID = ErrorCode.INVALID_ARG
_UNPARSED = "failed to parse the ModelInferRequest message"
# Below this size a request goes through protobuf whole: the copies it makes cost less
# than splitting the message in Python (measured: equal near 64 KiB; 5 vs 9 us at 16 KiB).
SPLIT_THRESHOLD = 64 * 1024

_RAW_INPUT_KEY = 0x3A  # field 7 (raw_input_contents), wire type 2
_RAW_OUTPUT_KEY = b"\x32"  # field 6 (raw_output_contents), wire type 2
_STREAM_RESPONSE_KEY = b"\x12"  # ModelStreamInferResponse.infer_response: field 2
_SHM_PARAMS = "shared_memory_region"
_SHM_PARAM_TYPES = (("shared_memory_region", "string_param"),
                    ("shared_memory_offset", "int64_param"),
                    ("shared_memory_byte_size", "int64_param"))

# typed `contents` field -> (numpy dtype it holds, datatypes it may carry). int/uint
# contents are 32-bit on the wire; narrower types keep the low bytes, as Triton does.
_TYPED_CONTENTS = {
    "bool_contents": (np.bool_, ("BOOL",)),
    "int_contents": (np.int32, ("INT32", "INT16", "INT8")),
    "int64_contents": (np.int64, ("INT64",)),
    "uint_contents": (np.uint32, ("UINT32", "UINT16", "UINT8")),
    "uint64_contents": (np.uint64, ("UINT64",)),
    "fp32_contents": (np.float32, ("FP32",)),
    "fp64_contents": (np.float64, ("FP64",)),
    "bytes_contents": (None, ("BYTES",)),
}
_CONTENTS_TYPE = {"bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
                  "uint_contents": "UINT32", "uint64_contents": "UINT64",
                  "fp32_contents": "FP32", "fp64_contents": "FP64", "bytes_contents": "BYTES"}
_NARROW = {"INT8": np.int8, "INT16": np.int16, "UINT8": np.uint8, "UINT16": np.uint16}


_GRPC_CODES = {code: getattr(grpc.StatusCode, name) for code, name in GRPC_STATUS.items()}


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status an error of `code` is answered with (Triton's mapping)."""
    return _GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN)


def _bad(message: str) -> InferError:
    return InferError(_INVALID, message)


# --------------------------------------------------------------------------- request


def decode_infer_request(data) -> DecodedRequest:
    """A serialized ModelInferRequest -> DecodedRequest; raises InferError.

    `data`: bytes, or a memoryview its caller never writes to again (the native gRPC
    transport's buffer of a unary call: taking it as it is spares a copy of the whole
    message, 3 ms for 16 MiB here). Raw input buffers are slices of `data` (no copy)
    for large messages; the slices keep it alive as long as the request. A request
    that repeats a remembered one's fields has its template as `memo`, where the core
    keeps its verdict for the next."""
    if type(data) is not bytes and type(data) is not memoryview:
        data = bytes(data)
    request, key = _from_template(data)
    if request is not None:
        return request
    if len(data) < SPLIT_THRESHOLD:
        try:
            msg = ModelInferRequest.FromString(data)
        except Exception:
            raise _bad(_UNPARSED) from None
        request = request_from_message(msg, msg.raw_input_contents)
    else:
        msg, raws = parse_infer_request(data)
        request = request_from_message(msg, raws)
    if key is not None:
        request.memo = _remember(key, msg, request)
    return request


# A client sends the same fields but the id and the tensor bytes with every request
# (model, inputs' names, datatypes and shapes, outputs): those fields, as wire bytes,
# key what protobuf and request_from_message made of them, and a request with them
# is built from that without parsing them again (protobuf and the walk over its
# objects cost ~7 us; this ~2). Only requests whose inputs are in raw_input_contents
# or a client's shared-memory region, with no other parameters, are kept: the rest
# decode in full each time. A region's parameters are part of the key's bytes, so a
# request that names another region or offset is another key (a shm request decoded
# in full took ~19 us: protobuf's parameter maps and their checks).
_REQUESTS: dict[bytes, tuple] = {}
_FIELD_KEYS = frozenset((0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32))  # fields 1-6, length-delimited
_ID_KEY = 0x1A
# a longer key (names, shapes, parameters) is not remembered: 4096 keys of a few
# MiB each would hold GiBs for a client that varies them
_TEMPLATE_KEY_MAX = 16 * 1024


def _from_template(data: bytes):
    """(DecodedRequest, None) when `data` repeats a remembered request's fields (its
    template the request's `memo`); (None, key) when it could be remembered once
    decoded; (None, None) otherwise. The template's verdict comes with the request
    where its raw inputs have the sizes it was given for."""
    end = len(data)
    # the last key without an id that was found: a message that begins with its
    # bytes, followed by a raw input or nothing, walks to the same key
    key = _last_key[0]
    n = len(key)
    if n and (n == end or n < end and data[n] == _RAW_INPUT_KEY) and data[:n] == key:
        template = _REQUESTS.get(key)
        if template is not None:
            return _built(template, data, n, end, "")
    pos = 0
    head = None
    fields = 0
    try:
        # protobuf writes fields in number order: 1-6, then every raw_input_contents
        while pos < end:
            key = data[pos]
            if key == _RAW_INPUT_KEY:
                break
            fields += 1
            if key not in _FIELD_KEYS or fields > WALK_FIELDS_MAX:
                return None, None
            size, start = _varint(data, pos + 1)
            nxt = start + size
            if key == _ID_KEY:
                head = data[:pos]
                rid_span = (start, nxt)
                id_end = nxt
            pos = nxt
        if pos > end or pos > _TEMPLATE_KEY_MAX:
            return None, None
        if head is None:
            key, rid = bytes(data[:pos]), ""
        else:
            key = bytes(head) + bytes(data[id_end:pos])
            rid = str(data[rid_span[0]:rid_span[1]], "utf-8")
    except (IndexError, UnicodeDecodeError):
        return None, None
    template = _REQUESTS.get(key)
    if template is None:
        return None, key
    if head is None:
        _last_key[0] = key
    return _built(template, data, pos, end, rid)


_last_key = [b""]


def _built(template: "_Template", data, pos: int, end: int, rid: str):
    """_from_template's answer for `data`, whose fields are `template`'s up to `pos`
    (its raw inputs follow)."""
    view = memoryview(data)
    decoded = []
    checked = template.checked
    sizes = template.sizes
    try:
        for i, (name, datatype, shape, params) in enumerate(template.inputs):
            if params is not None:  # in a client's region: no raw_input_contents
                decoded.append(DecodedInput(name, datatype, list(shape), None,
                                            dict(params)))
                continue
            if pos >= end or data[pos] != _RAW_INPUT_KEY:
                return None, None
            size, start = _varint(data, pos + 1)
            pos = start + size
            if pos > end:
                return None, None
            if checked is not None and sizes[i] != size:
                checked = None  # other sizes: checked again
            decoded.append(DecodedInput(name, datatype, list(shape), view[start:pos], {}))
    except IndexError:
        return None, None
    if pos != end:
        return None, None
    outputs = template.outputs
    request = DecodedRequest(template.model, template.version, rid, decoded,
                             None if outputs is None else
                             [RequestedOutput(name, None, 0, dict(params) if params else {})
                              for name, params in outputs], {}, checked=checked,
                             memo=template)
    return request, None


# the parameters a remembered request's tensors may have: a client region's
_SHM_KEYS = frozenset(k for k, _ in _SHM_PARAM_TYPES)


class _Template:
    """What a request's fields (all but its id and raw inputs) decode to, and the
    core's verdict on the last request decoded from them: (config, batch size) as
    DecodedRequest.checked, with the raw input sizes it was given for. A raw BYTES
    input's verdict is never kept (`reusable`): its length prefixes are in its
    bytes."""

    __slots__ = ("model", "version", "inputs", "outputs", "reusable", "checked", "sizes")

    def __init__(self, request: DecodedRequest, outputs):
        self.model = request.model_name
        self.version = request.model_version
        self.inputs = tuple((i.name, i.datatype, tuple(i.shape),
                             dict(i.parameters) if i.data is None else None)
                            for i in request.inputs)
        self.outputs = outputs
        self.reusable = not any(i.data is not None and element_size(i.datatype) is None
                                for i in request.inputs)
        self.checked = None
        self.sizes = ()

    def keep(self, request: DecodedRequest) -> None:
        """The core's verdict on `request`, for the next request with these fields and
        its raw input sizes."""
        if self.reusable:
            self.checked = request.checked
            self.sizes = tuple(None if i.data is None else len(i.data)
                               for i in request.inputs)


def _remember(key: bytes, msg, request: DecodedRequest) -> "_Template | None":
    if msg.parameters or request.parameters:
        return None
    for inp in request.inputs:
        # raw bytes, or a region (whose parameters request_from_message checked)
        if (inp.parameters.keys() - _SHM_KEYS
                or (inp.data is None) != (_SHM_PARAMS in inp.parameters)):
            return None
    for io in msg.inputs:
        if io.HasField("contents"):
            return None
    outputs = None
    if request.outputs is not None:
        if any(out.parameters.keys() - _SHM_KEYS for out in request.outputs):
            return None
        # copies: the template outlives this request, whose dicts are its own
        outputs = tuple((out.name, dict(out.parameters) or None)
                        for out in request.outputs)
    if len(_REQUESTS) >= 4096:  # clients with ever new shapes: start over
        _REQUESTS.clear()
    template = _REQUESTS[key] = _Template(request, outputs)
    return template


def request_id_of(data) -> str:
    """The `id` of a serialized ModelInferRequest, "" when it cannot be read (errors
    report it so that stream clients know which request failed)."""
    try:
        return parse_infer_request(data)[0].id
    except Exception:
        return ""


# The walker below reads at most this many top-level fields in Python; a message with
# more (a legitimate request has a handful per input) is left to protobuf, whose C
# parser is ~10x faster per field. So a message of millions of tiny fields costs
# protobuf's time, linear in its bytes, never a Python loop turn per two bytes.
WALK_FIELDS_MAX = 1024


def parse_infer_request(data):
    """A serialized ModelInferRequest -> (message without its raw_input_contents,
    the raw_input_contents as memoryviews of `data` or bytes); InferError when
    protobuf would refuse the message, exactly then.

    The raw contents are split off by `split_raw_input_contents` so that protobuf
    never copies them; where the walker is unsure (a group, a key of 3 bytes or more,
    more than WALK_FIELDS_MAX fields) protobuf parses the whole message and decides
    (a copy of it first, when it is a memoryview: protobuf's own)."""
    split = split_raw_input_contents(data)
    if split is None:
        msg = _parse(data)
        return msg, msg.raw_input_contents
    head, raws = split
    return _parse(head), raws


def _parse(data):
    try:
        return ModelInferRequest.FromString(data)
    except Exception:
        raise _bad(_UNPARSED) from None


def split_raw_input_contents(data):
    """Split a serialized ModelInferRequest into its other fields (bytes, to parse) and
    memoryviews over each raw_input_contents entry, in order; None when protobuf must
    decide; InferError when protobuf would refuse the message, whatever its other
    fields (field number 0, an end-group tag or wire type 6 or 7 at the top, a varint
    over 10 bytes, a field cut off by the end).

    Walks the top-level fields only (a handful per request), at most WALK_FIELDS_MAX
    of them. `data`: bytes or a memoryview, as decode_infer_request takes it. Where it
    answers, protobuf's parse of the whole message and of the returned head agree:
    every field it steps over is one protobuf reads the same way (number >= 1, wire
    type 0, 1, 2 or 5, inside the message), and raw_input_contents is a bytes field."""
    if not isinstance(data, (bytes, memoryview)):
        data = bytes(data)
    spans: list[tuple[int, int, int]] = []
    status = _walk(data, spans)
    if status is _DEFER:
        return None
    if status is not _WHOLE:
        raise _bad(_UNPARSED)
    if not spans:
        return data, []
    view = memoryview(data)
    head: list[memoryview] = []
    raws: list[memoryview] = []
    kept = 0
    for start, value, nxt in spans:
        if start > kept:
            head.append(view[kept:start])
        raws.append(view[value:nxt])
        kept = nxt
    if kept < len(data):
        head.append(view[kept:])
    return b"".join(head), raws


def malformed_prefix(data) -> bool:
    """Whether a message beginning with `data` is one protobuf refuses, whatever
    follows: a compressed message's inflation stops as soon as it is (a GiB of gzipped
    zeros is refused at its first byte, not once inflated)."""
    return _walk(data, None) is _REFUSED


# _walk's answers: the message walked to its end; protobuf must decide; protobuf
# refuses it; the data ends inside a field (refused, or undecided for a prefix)
_WHOLE, _DEFER, _REFUSED, _CUT = "whole", "defer", "refused", "cut"


def _walk(data, spans: list | None) -> str:
    """Walk `data`'s top-level fields, appending (field start, value start, end) of
    each raw_input_contents entry to `spans`; one of the answers above."""
    pos, end, fields = 0, len(data), 0
    try:
        while pos < end:
            fields += 1
            if fields > WALK_FIELDS_MAX:
                return _DEFER
            start = pos
            key = data[pos]
            if key < 0x80:
                pos += 1
            else:  # field numbers 16-2047; a longer key is protobuf's to read
                b = data[pos + 1]
                if b >= 0x80 or not b:
                    return _DEFER
                key = (key & 0x7F) | (b << 7)
                pos += 2
            wire = key & 7
            if key < 8 or wire == 4 or wire > 5:
                return _REFUSED  # field number 0, an end without a group, 6 and 7
            if wire == 2:
                size, pos = _varint(data, pos)
                nxt = pos + size
            elif wire == 0:
                _, nxt = _varint(data, pos)
            elif wire == 1:
                nxt = pos + 8
            elif wire == 5:
                nxt = pos + 4
            else:  # a group: protobuf skips it, nested as deep as it allows
                return _DEFER
            if nxt > end:
                return _CUT
            if key == _RAW_INPUT_KEY and spans is not None:
                spans.append((start, pos, nxt))
            pos = nxt
    except _Overlong:
        return _REFUSED
    except IndexError:
        return _CUT
    return _WHOLE


class _Overlong(IndexError):
    """A varint of more than 10 bytes (an IndexError: callers that only walk treat it
    as any field they cannot read)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 63:
            raise _Overlong


def request_from_message(msg, raws) -> DecodedRequest:
    """A parsed ModelInferRequest plus its raw input buffers -> DecodedRequest.

    `raws` is `msg.raw_input_contents` or the memoryviews split off the wire bytes."""
    model = msg.model_name
    nraw = len(raws)
    inputs = []
    iraw = 0
    for io in msg.inputs:
        name, datatype = io.name, io.datatype
        shape = list(io.shape)
        params = {}
        if io.parameters:
            _check_shm_parameters(name, io.parameters)
            params = _parameters(io.parameters)
        has_contents = io.HasField("contents")
        if _SHM_PARAMS in params:
            if has_contents:
                raise _bad(f"unexpected 'content' provided when using shared memory for "
                           f"input tensor '{name}' for model '{model}'")
            inputs.append(DecodedInput(name, datatype, shape, None, params))
            continue
        if has_contents:
            if nraw:
                raise _bad(f"contents field must not be specified when using "
                           f"raw_input_contents for '{name}' for model '{model}'")
            buf = _typed_contents(io.contents, name, datatype, model)
        elif iraw < nraw:
            buf = raws[iraw]
            iraw += 1
        elif nraw:
            iraw += 1  # counted for the mismatch message below
            continue
        else:
            raise _bad(f"unable to find data for input tensor '{name}' for model "
                       f"'{model}' in request.")
        if not is_known(datatype):
            _unknown(datatype, name, model)
        # shapes and byte sizes are checked against the model (validate.py), after its
        # name, count, datatype and shape checks: Triton's order and words
        inputs.append(DecodedInput(name, datatype, shape, buf, params))
    if iraw != nraw:
        raise _bad(f"expected {iraw} raw_input_contents (one per input not in shared "
                   f"memory) for model '{model}', got {nraw}")
    outputs = None
    if msg.outputs:
        outputs = []
        for out in msg.outputs:
            params = {}
            if out.parameters:
                _check_shm_parameters(out.name, out.parameters)
                params = _parameters(out.parameters)
            classes = params.get("classification", 0)
            if type(classes) is not int:
                raise _bad(f"invalid value type for 'classification' parameter of output "
                           f"'{out.name}', expected int64_param.")
            if _SHM_PARAMS in params and "classification" in params:
                raise _bad("output can't set both 'shared_memory_region' and "
                           "'classification'")
            outputs.append(RequestedOutput(out.name, None, classes, params))
    parameters = _request_parameters(msg.parameters) if msg.parameters else {}
    return DecodedRequest(model, msg.model_version, msg.id, inputs, outputs, parameters)


def _check_shm_parameters(name: str, params) -> None:
    """Triton's ParseSharedMemoryParams: a tensor's shared_memory_* parameters must have
    their types, and offset and byte size come only with a region, which needs a size."""
    has_region = _SHM_PARAMS in params
    for key, kind in _SHM_PARAM_TYPES:
        if key not in params:
            continue
        if not has_region:
            raise _bad(f"'{key}' can not be specified without 'shared_memory_region' "
                       f"parameter for tensor '{name}'")
        if params[key].WhichOneof("parameter_choice") != kind:
            raise _bad(f"invalid value type for '{key}' parameter for tensor '{name}', "
                       f"expected {kind}.")
    if has_region and "shared_memory_byte_size" not in params:
        raise _bad("'shared_memory_byte_size' must be specified along with "
                   f"'shared_memory_region' parameter for tensor '{name}'")


def _unknown(datatype: str, name: str, model: str):
    raise _bad(f"invalid datatype '{datatype}' for input '{name}' for model '{model}'")


def _typed_contents(contents, name: str, datatype: str, model: str):
    """Typed `contents` -> bytes in Triton's raw layout (one copy; these are small)."""
    found = None
    for field in contents.ListFields():
        if found is not None:
            raise _bad(f"unexpected explicit tensor data for input tensor '{name}' for "
                       f"model '{model}', binary data was already supplied.")
        found = field
    if found is None:  # contents present but empty: a zero-byte tensor
        return b""
    fname = found[0].name
    values = found[1]
    dtype, allowed = _TYPED_CONTENTS[fname]
    if datatype not in allowed:
        raise _bad(f"unexpected explicit tensor data for input tensor '{name}' for model "
                   f"'{model}' of type '{_CONTENTS_TYPE[fname]}', expected datatype "
                   f"'{datatype}'")
    if dtype is None:  # BYTES: 4-byte little-endian length, then the bytes
        parts = []
        for item in values:
            parts.append(len(item).to_bytes(4, "little"))
            parts.append(item)
        return b"".join(parts)
    arr = np.array(values, dtype=dtype)
    narrow = _NARROW.get(datatype)
    if narrow is not None:
        arr = arr.astype(narrow)  # keeps the low bytes, as Triton does
    return arr.tobytes()  # native order: little-endian on every platform we run on


def _param_value(key: str, p):
    kind = p.WhichOneof("parameter_choice")
    if kind is None:
        raise _bad(f"invalid value type for '{key}' parameter, expected int64_param, "
                   f"bool_param, string_param, double_param or uint64_param.")
    return getattr(p, kind), kind


def _parameters(params) -> dict:
    return {k: _param_value(k, p)[0] for k, p in params.items()}


def _request_parameters(params) -> dict:
    """Request parameters, with the type checks Triton applies to its reserved keys."""
    out = {}
    for key, p in params.items():
        value, kind = _param_value(key, p)
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param", "uint64_param"):
                raise _bad("invalid value type for 'sequence_id' parameter, expected "
                           "int64_param or string_param.")
            if kind == "string_param" and len(value.encode()) > CORRELATION_ID_MAX:
                raise _bad(CORRELATION_ID_TOO_LONG)
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise _bad(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key == "priority":
            if kind not in ("int64_param", "uint64_param"):
                raise _bad("invalid value type for 'priority' parameter, expected "
                           "int64_param or uint64_param.")
            if value < 0:
                raise _bad("invalid value for 'priority', expected value >= 0.")
        elif key == "timeout":
            if kind != "int64_param":
                raise _bad("invalid value type for 'timeout' parameter, expected "
                           "int64_param.")
        elif key.startswith("triton_") and key != "triton_enable_empty_final_response":
            raise _bad("parameter keys starting with 'triton_' are reserved for Triton "
                       "usage. Only the following keys starting with 'triton_' are "
                       "allowed: triton_enable_empty_final_response")
        out[key] = value
    return out


# -------------------------------------------------------------------------- response


def set_parameters(target, params: dict) -> None:
    """Fill a protobuf map<string, InferParameter> from a python dict."""
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if value >= 1 << 63:
                p.uint64_param = value
            else:
                p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        elif isinstance(value, (bytes, bytearray)):
            p.string_param = bytes(value).decode("utf-8", "replace")
        else:
            p.string_param = str(value)


def _field(key: bytes, value: bytes) -> bytes:
    """One length-delimited protobuf field: key, length, value."""
    return key + _varint_bytes(len(value)) + value


# Serialized pieces a response repeats, built once: the model name and version fields,
# and each output's InferOutputTensor entry (name, datatype, shape), keyed by what it
# holds. Bounded: shapes vary with the batch, names with the models served.
_HEADS: dict[tuple, bytes] = {}
_TENSORS: dict[tuple, bytes] = {}
_TEMPLATES_MAX = 4096


def _tensor_entry(name: str, datatype: str, shape) -> bytes:
    key = (name, datatype, *shape)
    entry = _TENSORS.get(key)
    if entry is None:
        body = _field(b"\x0a", name.encode()) if name else b""
        if datatype:
            body += _field(b"\x12", datatype.encode())
        if shape:
            dims = b"".join(_varint_bytes(d & 0xFFFFFFFFFFFFFFFF) for d in shape)
            body += _field(b"\x1a", dims)  # packed int64, as protobuf writes it
        entry = _field(b"\x2a", body)  # ModelInferResponse.outputs: field 5
        if len(_TENSORS) >= _TEMPLATES_MAX:
            _TENSORS.clear()
        _TENSORS[key] = entry
    return entry


def _plain_head(result: InferResult, request_id: str | None) -> bytes | None:
    """Fields 1-5 of a response without parameters, from the cached pieces; None when
    a response or an output has parameters (protobuf writes those)."""
    key = (result.model_name, result.model_version)
    head = _HEADS.get(key)
    if head is None:
        name, version = key
        head = ((_field(b"\x0a", name.encode()) if name else b"")
                + (_field(b"\x12", version.encode()) if version else b""))
        if len(_HEADS) >= _TEMPLATES_MAX:
            _HEADS.clear()
        _HEADS[key] = head
    rid = result.id or request_id
    parts = [head, _field(b"\x1a", rid.encode())] if rid else [head]
    for out in result.outputs:
        if out.parameters:
            return None
        parts.append(_tensor_entry(out.name, out.datatype, out.shape))
    return b"".join(parts)


def _response_parts(result: InferResult, request_id: str | None,
                    params: dict | None = None) -> tuple[list, int]:
    """The serialized ModelInferResponse as a list of buffers, and its total size."""
    head = None if params else _plain_head(result, request_id)
    if head is not None:
        return _append_raw(head, [out.data for out in result.outputs])
    msg = ModelInferResponse(model_name=result.model_name,
                             model_version=result.model_version,
                             id=result.id or request_id or "")
    if params:
        set_parameters(msg.parameters, params)
    add = msg.outputs.add
    datas = []
    for out in result.outputs:
        t = add(name=out.name, datatype=out.datatype, shape=out.shape)
        params = out.parameters
        if params and out.data is None:
            # written into the client's region: Triton says nothing more about it
            params = {k: v for k, v in params.items() if not k.startswith("shared_memory_")}
        if params:
            set_parameters(t.parameters, params)
        datas.append(out.data)
    return _append_raw(msg.SerializeToString(), datas)


def _append_raw(head: bytes, datas: list) -> tuple[list, int]:
    """`head` followed by one raw_output_contents entry per output's data."""
    parts = [head]
    total = len(head)
    # One raw_output_contents entry per output, empty when the output went to a shared
    # memory region (data None): tritonclient's InferResult.as_numpy finds an output's
    # entry by the output's position, and Triton's allocator adds one for every output.
    for data in datas:
        if data is None:
            n = 0
        elif type(data) is bytes:
            n = len(data)
        else:
            data = memoryview(data)
            if not data.c_contiguous:
                data = data.tobytes()
                n = len(data)
            else:
                n = data.nbytes
                if data.format != "B" or data.ndim != 1:
                    data = data.cast("B")
        prefix = _RAW_OUTPUT_KEY + _varint_bytes(n)
        parts.append(prefix)
        total += len(prefix) + n
        if n:
            parts.append(data)
    return parts, total


def encode_infer_response(result: InferResult, request_id: str | None = None) -> bytes:
    """An InferResult -> serialized ModelInferResponse (outputs as raw_output_contents).

    `request_id` is echoed when the result carries no id. Does not release `result`."""
    parts, _ = _response_parts(result, request_id, result.parameters)
    return b"".join(parts)


def encode_stream_response(result: InferResult, request_id: str | None = None,
                           final: bool | None = None) -> bytes:
    """An InferResult -> serialized ModelStreamInferResponse carrying it, with the
    response's parameters and, when `final` is given, Triton's `triton_final_response`
    (set on every response a stream carries once the request has run)."""
    params = result.parameters
    if final is not None:
        params = {**params, "triton_final_response": final}
    parts, total = _response_parts(result, request_id, params)
    parts.insert(0, _STREAM_RESPONSE_KEY + _varint_bytes(total))
    return b"".join(parts)


def encode_stream_error(message: str, request_id: str = "", *, model_name: str = "",
                        model_version: str = "", final: bool | None = None) -> bytes:
    """A ModelStreamInferResponse reporting an error; the request id is kept so the
    client knows which request failed (as Triton does). An error response of a request
    that ran also names the model and carries `triton_final_response` (`final`)."""
    msg = service_pb2.ModelStreamInferResponse(error_message=message)
    if request_id:
        msg.infer_response.id = request_id
    if final is not None:
        msg.infer_response.model_name = model_name
        msg.infer_response.model_version = model_version
        msg.infer_response.parameters["triton_final_response"].bool_param = final
    return msg.SerializeToString()


def encode_stream_empty_final(request_id: str, model_name: str,
                              model_version: str) -> bytes:
    """The response Triton sends for a decoupled model's send(None, FINAL) when the
    request set `triton_enable_empty_final_response`: no outputs, just the flag."""
    msg = service_pb2.ModelStreamInferResponse()
    r = msg.infer_response
    r.id, r.model_name, r.model_version = request_id, model_name, model_version
    r.parameters["triton_final_response"].bool_param = True
    return msg.SerializeToString()


def _varint_bytes(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]
