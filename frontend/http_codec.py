"""KServe v2 HTTP/REST inference bodies with Triton's binary tensor data extension.

Pure functions, no I/O: `decode_infer_request` turns a request body into a
`DecodedRequest` and `encode_infer_response` turns an `InferResult` into a response
body. An inference body is a JSON header, optionally followed by raw tensor bytes when
the `Inference-Header-Content-Length` header says where the JSON ends; each binary
input says how many of those bytes are its own with `parameters.binary_data_size`, in
input order. Binary inputs are memoryview slices of the body: no copy.

Error texts follow Triton's http_server.cc (they are what tritonclient users see).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
import zlib

import numpy as np

from shm.datatypes import NUMPY, element_size, is_known
from shm.errors import ErrorCode, InferError

from . import inflate
from .classification import classify
from .types import (CORRELATION_ID_MAX, CORRELATION_ID_TOO_LONG, DecodedInput,
                    DecodedRequest, InferResult, RequestedOutput)

# JSON: measured on a tritonclient request header and a [1,16] FP32 response, best of
# 9: loads json 2.6 us, msgspec 0.6 (0.6 on a memoryview), orjson 0.6 (1.1 on a
# memoryview: it copies); dumps json 20 us, msgspec 0.27 (0.80 with 16 floats), orjson
# 0.18 (0.44). So msgspec parses (straight from the body's memoryview) and orjson
# writes; each falls back to the other, then to the standard library.
# RecursionError: a document nested deeper than the decoder's stack is malformed input
# (msgspec's and json's limits are ~1000 levels); every route that parses JSON
# catches JSON_ERRORS, so that such a body is a 400, not a 500
_JSON_ERRORS: tuple = (ValueError, RecursionError)
try:
    import msgspec

    json_loads = msgspec.json.Decoder().decode
    json_dumps = msgspec.json.Encoder().encode
    _JSON_ERRORS = (msgspec.DecodeError, ValueError, RecursionError)
except ImportError:  # pragma: no cover - the project installs msgspec
    msgspec = None
try:
    import orjson

    json_dumps = orjson.dumps  # noqa: F811
    if msgspec is None:  # pragma: no cover
        json_loads = orjson.loads
except ImportError:
    orjson = None
if msgspec is None and orjson is None:  # pragma: no cover
    def json_loads(data):
        return json.loads(bytes(data))

    def json_dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
JSON_ERRORS = _JSON_ERRORS

HEADER_LENGTH = "inference-header-content-length"  # lower case, as ASGI gives headers
_INVALID = ErrorCode.INVALID_ARG
_LEN = struct.Struct("<I")
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
# numpy kinds a JSON array may decode to for each datatype (Triton rejects e.g. 1.5
# for INT32 and true for FP32); integer types are checked by _json_ints
_JSON_KINDS = {"BOOL": "b", "FP16": "iuf", "FP32": "iuf", "FP64": "iuf"}
_INT_TYPES = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}
_RESERVED_PARAMS = {"sequence_start", "sequence_end", "binary_data_output"}
# the tail of Triton's "Unable to parse '<field>': ..." messages, in the words of its
# JSON accessors (triton_json.h); the FP and unsigned ones were checked on 2.51
_NOT_ARRAY = "attempt to access JSON non-array as array"
_JSON_ACCESS = {
    **{t: "attempt to access JSON non-number as double" for t in ("FP16", "FP32", "FP64")},
    **{t: "attempt to access JSON non-unsigned-integer as unsigned-integer"
       for t in ("UINT8", "UINT16", "UINT32", "UINT64")},
    **{t: "attempt to access JSON non-signed-integer as signed-integer"
       for t in ("INT8", "INT16", "INT32", "INT64")},
    "BOOL": "attempt to access JSON non-boolean as boolean",
}


def _bad(message: str) -> InferError:
    return InferError(_INVALID, message)


def _nbytes(data) -> int:
    """Byte size of any bytes-like object (a numpy array's len() is its first dim)."""
    return len(data) if type(data) is bytes else memoryview(data).nbytes


# --------------------------------------------------------------------------- request


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The `Inference-Header-Content-Length` header as an int (None when absent)."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise _bad(f"Unable to parse Inference-Header-Content-Length, got: {value}")
    if length < 0 or length > body_length:
        raise _bad(f"inference header size should be in range (0, {body_length}), "
                   f"got: {value}")
    return length


def decompress(body: bytes, encoding: str | None, limit: int | None = None):
    """Undo a request's `Content-Encoding` (gzip or deflate, i.e. zlib, as Triton),
    all at once (`decompress_async` is the server's, a step at a time). Output past
    `limit` bytes is refused as Triton refuses it under --http-max-input-size,
    without inflating more than `limit` + 1 bytes."""
    if not encoding or encoding == "identity":
        return body
    inf = _inflater(body, encoding, limit)
    try:
        while not inf.step():
            pass
    except (zlib.error, inflate.TooLarge) as e:
        raise _inflate_error(e, encoding, limit) from None
    return inf.result()


async def decompress_async(body, encoding: str | None, limit: int):
    """decompress(), inflating inflate.STEP bytes at a time with the event loop serving
    other requests in between: a gzip bomb holds no one up while it is capped."""
    if not encoding or encoding == "identity":
        return body
    inf = _inflater(body, encoding, limit)
    try:
        while not inf.step():
            await asyncio.sleep(0)
    except (zlib.error, inflate.TooLarge) as e:
        raise _inflate_error(e, encoding, limit) from None
    return inf.result()


def _inflater(body, encoding: str, limit: int | None) -> inflate.Inflater:
    if encoding not in ("gzip", "deflate"):
        raise InferError(ErrorCode.UNSUPPORTED, "Unsupported compression type")
    return inflate.Inflater(body, encoding, (1 << 62) if limit is None else limit, True)


def _inflate_error(e: Exception, encoding: str, limit: int | None) -> InferError:
    if isinstance(e, inflate.TooLarge):
        return _bad("Decompressed data size exceeds the maximum allowed value of "
                    f"{limit} bytes. Use --http-max-input-size to increase the limit.")
    return _bad(f"failed to decompress the request body ({encoding}): {e}")


def _refuse_constant(name: str):
    raise ValueError(f"invalid literal {name}")  # NaN, Infinity: not JSON


def _raw_bytes_json(raw, error: UnicodeDecodeError) -> dict:
    """The request JSON whose strings hold bytes that are not UTF-8. Triton 2.51 takes
    them (RapidJSON copies a string's bytes without checking them; checked: 200, the
    model gets the bytes, and a JSON output gives them back as they came), and a BYTES
    tensor is bytes to the model, so a client may send any in its `data` strings: they
    reach the model unchanged (surrogateescape round trip). Anywhere else (names, id,
    parameters) text must be UTF-8 here: 400, the decoder's words."""
    try:
        request = json.loads(bytes(raw).decode("utf-8", "surrogateescape"),
                             parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise _bad(f"failed to parse the request JSON buffer: {error}") from None
    if type(request) is dict:
        text = {k: v for k, v in request.items() if k != "inputs"}
        inputs = request.get("inputs")
        if type(inputs) is list:
            text["inputs"] = [{k: v for k, v in i.items() if k != "data"}
                              if type(i) is dict else i for i in inputs]
        try:
            json.dumps(text, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(f"failed to parse the request JSON buffer: {error}") from None
    return request


def decode_infer_request(body, header_length: int | None, model_name: str,
                         model_version: str = "") -> DecodedRequest:
    """Decode an inference request body.

    `header_length` is the parsed `Inference-Header-Content-Length` (None: the whole
    body is JSON). Inputs sent as JSON `data` are converted to Triton's raw layout;
    binary inputs become zero-copy memoryview slices of `body`; inputs in a registered
    shared-memory region get `data=None` with the region in their `parameters`.
    Raises InferError(INVALID_ARG) for anything malformed.
    """
    end = len(body) if header_length is None else header_length
    view = memoryview(body)
    try:
        request = json_loads(view[:end] if end != len(body) else body)
    except UnicodeDecodeError as e:  # a string's bytes are not UTF-8
        request = _raw_bytes_json(view[:end], e)
    except _JSON_ERRORS as e:
        raise _bad(f"failed to parse the request JSON buffer: {e}")
    if type(request) is not dict:
        raise _bad("failed to parse the request JSON buffer: expected a JSON object")

    request_id = request.get("id", "")
    if type(request_id) is not str:
        raise _bad("Unable to parse 'id'")
    params = request.get("parameters", {})
    _check_request_parameters(params)  # null too: Triton reads any member as an object

    inputs_json = request.get("inputs")
    if type(inputs_json) is not list:
        raise _bad("Unable to parse 'inputs': " + (
            "attempt to access non-existing object member 'inputs'"
            if inputs_json is None else _NOT_ARRAY))
    inputs = []
    pos = end
    for item in inputs_json:
        if type(item) is not dict:
            raise _bad("Unable to parse 'inputs'")
        iparams = _item_parameters(item)
        size = iparams.get("binary_data_size")
        has_data = "data" in item
        has_shm = "shared_memory_region" in iparams
        if has_data + (size is not None) + has_shm != 1:
            raise _bad(_content_type_error(has_data, size is not None, has_shm))
        name = item.get("name")
        if type(name) is not str:
            raise _bad("Unable to parse 'name'")
        datatype = item.get("datatype")
        if type(datatype) is not str:
            raise _bad("Unable to parse 'datatype'")
        shape = item.get("shape")
        if type(shape) is not list:
            raise _bad("Unable to parse 'shape': " + _NOT_ARRAY)
        for d in shape:
            if type(d) is not int or d < 0:
                raise _bad("Unable to parse 'shape': " + _JSON_ACCESS["UINT64"])

        if size is not None:
            if type(size) is not int or size < 0:
                raise _bad("Unable to parse 'binary_data_size'")
            # without Inference-Header-Content-Length the body is all JSON, so the
            # binary part is missing: Triton 2.51 says so in these words
            if pos + size > len(body):
                raise _bad(
                    f"unexpected size for input '{name}', expecting "
                    f"{pos + size - len(body)} additional bytes for model "
                    f"'{model_name}'")
            data = view[pos:pos + size]  # zero copy
            pos += size
        elif has_shm:
            _check_shm_json(iparams)
            data = None
        else:
            data = _json_to_raw(name, datatype, shape, item["data"])
        inputs.append(DecodedInput(name, datatype, shape, data, iparams))
    if pos != len(body):
        raise _bad(f"unexpected additional input data for model '{model_name}'")

    outputs = None
    if "outputs" in request:
        # null and {} too: Triton reads any "outputs" member as an array
        outputs_json = request["outputs"]
        if type(outputs_json) is not list:
            raise _bad("Unable to parse 'outputs': " + _NOT_ARRAY)
        outputs = [_decode_output(o) for o in outputs_json] or None
    return DecodedRequest(model_name, model_version, request_id, inputs, outputs, params)


class _Seen:
    """A header decoded before: the request's parts that its bytes alone decide, and
    where each binary input lies in the body (None: in a client's region)."""

    __slots__ = ("id", "parameters", "inputs", "outputs", "checked", "reusable")

    def __init__(self, request: DecodedRequest, end: int):
        self.id = request.id
        self.parameters = request.parameters
        self.outputs = request.outputs
        self.inputs = []
        pos = end
        for inp in request.inputs:
            if inp.data is None:
                where = None
            else:
                size = _nbytes(inp.data)
                where = (pos, pos + size)
                pos += size
            self.inputs.append((inp.name, inp.datatype, inp.shape, where, inp.parameters))
        self.checked = None
        # validation reads a BYTES input's bytes (its length prefixes): its verdict
        # holds for the next body only where no input's bytes matter
        self.reusable = not any(inp.data is not None and element_size(inp.datatype) is None
                                for inp in request.inputs)

    def keep(self, request: DecodedRequest) -> None:
        """The core's verdict on `request`, for the next body with this header."""
        if self.reusable:
            self.checked = request.checked


class HeaderMemo:
    """decode_infer_request, remembering the headers it decoded last.

    A client sends the same JSON header again and again (tritonclient and
    perf_analyzer with the same inputs: only the binary bytes after it change), and
    parsing and checking it was a tenth of an HTTP request's cost in the frontend.
    A body whose header (with the model, version and body length) was decoded before
    is decoded from what that one gave: its inputs are the new body's slices at the
    same places, and its validation against the same model config stands
    (`DecodedRequest.checked`, which the core keeps in the entry: `memo`).

    Only headers whose inputs are all binary or in client regions are kept (an input
    sent as JSON `data` is part of the header, different every time), of at most
    `max_bytes`, `entries` of them, the oldest dropped first: a client that never
    repeats itself costs one lookup and one insertion per request, and what the memo
    holds stays a process's few megabytes at most whatever the clients send (a header
    of 2 KiB decodes to a few tens of KiB of objects at worst). The parts kept
    (parameters, shapes, requested outputs) are shared by the requests built from
    them, and nothing downstream changes them; header forwarding copies the
    parameters before adding to them (http_server.InferEndpoint.respond)."""

    def __init__(self, entries: int = 64, max_bytes: int = 2048):
        self.entries = entries
        self.max_bytes = max_bytes
        self.seen: dict[tuple, _Seen] = {}

    def decode(self, body, header_length: int | None, model_name: str,
               model_version: str = "") -> tuple[DecodedRequest, _Seen | None]:
        """(the request, its memo entry or None), as decode_infer_request decodes it."""
        n = len(body)
        end = n if header_length is None else header_length
        if end > self.max_bytes:
            return decode_infer_request(body, header_length, model_name, model_version), None
        head = body if (end == n and type(body) is bytes) else bytes(body[:end])
        key = (head, n, model_name, model_version)
        seen = self.seen.get(key)
        if seen is None:
            request = decode_infer_request(body, header_length, model_name, model_version)
            for inp in request.inputs:
                if inp.data is not None and "binary_data_size" not in inp.parameters:
                    return request, None  # JSON data: not a header worth keeping
            if len(self.seen) >= self.entries:
                del self.seen[next(iter(self.seen))]
            seen = request.memo = self.seen[key] = _Seen(request, end)
            return request, seen
        view = memoryview(body)
        inputs = [DecodedInput(name, datatype, shape,
                               None if where is None else view[where[0]:where[1]], params)
                  for name, datatype, shape, where, params in seen.inputs]
        return DecodedRequest(model_name, model_version, seen.id, inputs, seen.outputs,
                              seen.parameters, checked=seen.checked, memo=seen), seen


def _content_type_error(has_data: bool, has_binary: bool, has_shm: bool) -> str:
    msg = ("Input must set only one of the following fields: 'data', "
           "'binary_data_size' in 'parameters', 'shared_memory_region' in "
           "'parameters'. But")
    if not (has_data or has_binary or has_shm):
        return msg + " no field is set"
    msg += " set"
    for flag, field in ((has_data, "data"), (has_binary, "binary_data_size"),
                        (has_shm, "shared_memory_region")):
        if flag:
            msg += f" '{field}'"
    return msg


def _check_request_parameters(params) -> None:
    if type(params) is not dict:  # Triton 2.51's words (with 500: the client's fault)
        raise _bad("failed to get request params.: attempt to get members for non-object")
    for key, value in params.items():
        kind = type(value)
        if key in _RESERVED_PARAMS:
            if kind is not bool:
                raise _bad(f"Unable to parse '{key}'")
        elif key == "priority" or key == "timeout":
            # Triton reads both with MemberAsUInt and passes its error through as
            # INTERNAL (HTTP 500): negative, fractional, string, bool, null and past
            # 2**64 all fail. The fault is the client's: 400, Triton's words (issue
            # 11, 5b, as for the other bodies its JSON reader cannot use)
            if kind is not int or not 0 <= value < 1 << 64:
                raise _bad(f"Unable to parse '{key}': attempt to access JSON "
                           "non-unsigned-integer as unsigned-integer")
        elif key == "sequence_id":
            if not ((kind is int and value >= 0) or kind is str):
                raise _bad("Unable to parse 'sequence_id'")
            if kind is str and len(value.encode()) > CORRELATION_ID_MAX:
                raise _bad(CORRELATION_ID_TOO_LONG)
        elif key.startswith("triton_"):
            raise _bad("parameter keys starting with 'triton_' are reserved for Triton "
                       "usage and should not be specified.")
        elif kind not in (str, int, bool, float):
            raise _bad(f"parameter '{key}' has invalid type. It should be either "
                       "'int', 'bool', or 'string'.")


def _item_parameters(item: dict) -> dict:
    """An input's or output's "parameters" object ({} when absent)."""
    params = item.get("parameters")
    if params is None:
        return {}
    if type(params) is not dict:
        raise _bad("Unable to parse 'parameters'")
    return params


def _check_shm_json(params: dict) -> None:
    """The types Triton's CheckSharedMemoryData insists on (whether a byte size is
    given, and what it must be, is the validator's business)."""
    if type(params["shared_memory_region"]) is not str:
        raise _bad("Unable to parse 'shared_memory_region'")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        value = params.get(key, 0)
        if type(value) is not int or value < 0:
            raise _bad(f"Unable to parse '{key}'")


def _decode_output(item) -> RequestedOutput:
    if type(item) is not dict:
        raise _bad("Unable to parse 'outputs'")
    params = _item_parameters(item)
    binary = params.get("binary_data")
    if "shared_memory_region" in params:
        _check_shm_json(params)
        if "classification" in params:
            raise _bad("Output can't set both 'shared_memory_region' and "
                       "'classification'")
        if binary is True:
            raise _bad("Output can't set both 'shared_memory_region' and 'binary_data'")
    name = item.get("name")
    if type(name) is not str:
        raise _bad("Unable to parse 'name'")
    if binary is not None and type(binary) is not bool:
        raise _bad("Unable to parse 'binary_data'")
    classes = params.get("classification", 0)
    if type(classes) is not int or classes < 0:
        raise _bad("Unable to set 'classification'")
    return RequestedOutput(name, binary, classes, params)


def _flatten(data, out: list) -> list:
    for item in data:
        if type(item) is list:
            _flatten(item, out)
        else:
            out.append(item)
    return out


def _json_to_raw(name: str, datatype: str, shape: list[int], data):
    """JSON `data` (flat or nested) -> raw little-endian bytes (BYTES length-prefixed)."""
    count = 1
    for d in shape:
        count *= d
    if type(data) is not list:
        raise _bad("Unable to parse 'data'")
    if count == 0 and not _flatten(data, []):
        return b""
    # values sent for an empty tensor are converted and then refused by the byte-size
    # check (as Triton: "input byte size mismatch"), never silently dropped
    if datatype == "BYTES":
        parts = []
        for item in _flatten(data, []):
            if type(item) is not str:
                raise _bad("Unable to parse 'data': expected a string element for "
                           f"BYTES input '{name}'")
            try:  # bytes that were not UTF-8 in the body come back as they came
                raw = item.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # an escaped lone surrogate, e.g. "\ud800"
                raise _bad(f"Unable to parse 'data': invalid string for BYTES input "
                           f"'{name}'") from None
            parts.append(_LEN.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)
    if datatype == "BF16":
        raise _bad("receiving BF16 data via JSON is not supported. Please use the "
                   f"binary data format for input {name}")
    if not is_known(datatype):
        raise _bad(f"invalid datatype for input {name}")
    try:
        arr = np.array(data)
    except (ValueError, TypeError):  # ragged nesting
        raise _bad(_SHAPE_MISMATCH)
    if arr.size != count and count:
        raise _bad(_SHAPE_MISMATCH)  # Triton's words, exactly: no counts
    if datatype in _INT_TYPES:
        arr = _json_ints(datatype, arr, data)
    elif arr.dtype.kind not in _JSON_KINDS[datatype]:
        raise _bad(f"Unable to parse 'data': {_JSON_ACCESS[datatype]}")
    arr = arr.astype(NUMPY[datatype], copy=False).reshape(-1)
    return memoryview(arr).cast("B")


def _json_ints(datatype: str, arr: np.ndarray, data) -> np.ndarray:
    """JSON integers for an integer datatype, read as Triton reads them: as int64 for
    a signed type, uint64 for an unsigned one (anything else, a negative number for an
    unsigned type or one past INT64_MAX for a signed one included, is refused), then
    cut to the type's low bytes."""
    kind = arr.dtype.kind
    unsigned = datatype[0] == "U"
    if kind == "i" and not (unsigned and arr.size and arr.min() < 0):
        return arr
    if kind == "u" and unsigned:
        return arr
    if kind in "fO":
        # numpy holds a mix of large and small integers as float64 (losing digits) or
        # objects: take each value exactly
        lo, hi = (0, 1 << 64) if unsigned else (-(1 << 63), 1 << 63)
        values = _flatten(data, [])
        if all(type(v) is int and lo <= v < hi for v in values):
            size = NUMPY[datatype].itemsize
            mask = (1 << (8 * size)) - 1
            return np.array([v & mask for v in values],
                            dtype=f"<u{size}").view(NUMPY[datatype])
    raise _bad(f"Unable to parse 'data': {_JSON_ACCESS[datatype]}")


def decode_raw_request(body, config, model_name: str,
                       model_version: str = "") -> DecodedRequest:
    """A request whose `Inference-Header-Content-Length` is 0: the whole body is the
    data of the model's only input (Triton's raw binary request), shape deduced from
    the config; outputs come back binary."""
    inputs = list(config.input)
    if len(inputs) != 1:
        raise _bad(f"Raw request must only have 1 input (found 1) to be deduced but got "
                   f"{len(inputs)} inputs in '{model_name}' model configuration")
    cfg = inputs[0]
    from shm.datatypes import from_config
    from tritonclient.grpc import model_config_pb2

    datatype = from_config(model_config_pb2.DataType.Name(cfg.data_type))
    shape = [1] if config.max_batch_size != 0 else []
    dynamic = -1
    fixed = 1
    for d in cfg.dims:
        if d == -1:
            if dynamic != -1:
                raise _bad(f"The shape of the raw input '{cfg.name}' can not be deduced "
                           "because there are more than one variable-sized dimension")
            dynamic = len(shape)
        else:
            fixed *= d
        shape.append(int(d))
    if datatype == "BYTES":
        if dynamic != -1 or fixed != 1:
            raise _bad(f"For BYTE datatype raw input '{cfg.name}', the model must have "
                       "input shape [1]")
        data = _LEN.pack(len(body)) + bytes(body)  # one element: prefix its length
    else:
        data = memoryview(body)
        if dynamic != -1:
            shape[dynamic] = len(body) // max(fixed * element_size(datatype), 1)
    return DecodedRequest(
        model_name, model_version, "", [DecodedInput(cfg.name, datatype, shape, data)],
        None, {"binary_data_output": True})


# -------------------------------------------------------------------------- response


def encode_infer_response(result: InferResult, request: DecodedRequest, *,
                          batching: bool = False,
                          labels: dict | None = None) -> tuple[bytes, int | None]:
    """Encode `result` as Triton does; returns (body, header_length).

    header_length is None when the body is all JSON; otherwise the body is the JSON
    header followed by each binary output's bytes, and the caller sends
    `Inference-Header-Content-Length: header_length`. An output is binary when its
    requested output says `binary_data`, else when the request set
    `parameters.binary_data_output`. BF16 outputs, and BYTES outputs that are not
    UTF-8, are always sent binary (JSON cannot carry them). `batching` (the model's
    max_batch_size > 0) and `labels` ({output: [label, ...]}) serve classification.
    The caller releases the result afterwards; the body holds no views into it.
    """
    default_binary = request.parameters.get("binary_data_output") is True
    wanted = None
    if request.outputs:
        wanted = {o.name: o for o in request.outputs}
    outputs = []
    buffers = []
    for out in result.outputs:
        asked = wanted.get(out.name) if wanted is not None else None
        if asked is None or asked.binary_data is None:
            binary = default_binary
        else:
            binary = asked.binary_data
        datatype = out.datatype
        shape = out.shape
        data = out.data
        if asked is not None and asked.class_count > 0 and data is not None:
            datatype, shape, data = classify(
                out.name, out.datatype, out.shape, data, asked.class_count, batching,
                labels.get(out.name) if labels else None)
        entry = {"name": out.name, "datatype": datatype, "shape": shape}
        if data is None:
            # Written into the client's shared-memory region: as Triton, no data, no
            # binary_data_size and no shared_memory_* echo (only other parameters).
            params = {k: v for k, v in out.parameters.items()
                      if not k.startswith("shared_memory_")}
            if params:
                entry["parameters"] = params
        else:
            values = None
            if not binary:
                values = _raw_to_json(out.name, datatype, shape, data)
            if values is None:
                size = _nbytes(data)
                entry["parameters"] = ({**out.parameters, "binary_data_size": size}
                                       if out.parameters else {"binary_data_size": size})
                if size:
                    buffers.append(data)
            else:
                if out.parameters:
                    entry["parameters"] = out.parameters
                entry["data"] = values
        outputs.append(entry)
    response = {}
    response_id = result.id or request.id
    if response_id:
        response["id"] = response_id
    response["model_name"] = result.model_name
    response["model_version"] = str(result.model_version)
    if result.parameters:  # the model's response parameters
        response["parameters"] = result.parameters
    response["outputs"] = outputs
    header = json_dumps(response)
    if not buffers:
        return header, None
    # the one copy of each output: into the body, so the result can be released now
    return b"".join([header, *buffers]), len(header)


def _raw_to_json(name: str, datatype: str, shape, data):
    """Raw output bytes -> flat JSON list, or None when JSON cannot carry them."""
    count = 1
    for d in shape:
        count *= d
    if datatype == "BYTES":
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        values = []
        pos, end = 0, len(view)
        try:
            for _ in range(count):
                (n,) = _LEN.unpack_from(view, pos)
                if pos + 4 + n > end:
                    raise struct.error
                values.append(str(view[pos + 4:pos + 4 + n], "utf-8"))
                pos += 4 + n
        except struct.error:
            raise InferError(ErrorCode.INTERNAL, "output tensor shape does not match "
                             f"size of output for '{name}'")
        except UnicodeDecodeError:
            return None
        return values
    dtype = NUMPY.get(datatype)
    if dtype is None or datatype == "BF16":
        return None
    size = _nbytes(data)
    if size != count * dtype.itemsize:
        raise InferError(ErrorCode.INTERNAL,
                         f"output tensor shape does not match size of output for '{name}'")
    return np.frombuffer(data, dtype=dtype).tolist()


def encode_error(message: str) -> bytes:
    """Triton's error body: {"error": "<message>"}."""
    return json_dumps({"error": message})


def accepted_encoding(accept_encoding: str | None) -> str | None:
    """The response compression Triton would choose for an `Accept-Encoding` value:
    'gzip' or 'deflate', or None for identity (highest q-value wins)."""
    if not accept_encoding:
        return None
    best, weight = None, 0.0
    for part in accept_encoding.split(","):
        kind, _, q = part.strip().partition(";q=")
        try:
            w = float(q) if q else 1.0
        except ValueError:
            continue
        if kind in ("identity", "gzip", "deflate") and w > weight:
            best, weight = kind, w
    return None if best == "identity" else best


def compress(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body, 1) if encoding == "gzip" else zlib.compress(body, 1)
