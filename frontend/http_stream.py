"""HTTP routes that answer with a stream of responses, and client-disconnect watching.

- `POST v2/models/{model}[/versions/{v}]/generate` and `.../generate_stream`: Triton's
  generate extension (docs `protocol/extension_generate.md`). The request is one JSON
  object: a key that names a model input becomes that tensor (a scalar or a 1-D array,
  shaped as Triton does from the model's metadata), any other key (and every key of
  the optional "parameters" object) a request parameter. Each response becomes one
  JSON object: id, model_name, model_version, the response's parameters and every
  output by name (one element: the value itself). `generate` answers the one response
  (a model that sends none or several gets Triton 2.51's error); `generate_stream`
  sends each as a server-sent event (`data: <json>\\n\\n`) as soon as it arrives.
  An error before the model runs is an ordinary JSON error with its status; one after
  (in the stream) is an `{"error": ...}` event, the status being the first response's.
- `POST v2/models/{model}[/versions/{v}]/infer_stream` (shmserve's, not Triton's): the
  body of `/infer` (JSON or binary tensor extension) in, and every response of the
  request out as it arrives, in the binary tensor format, framed (see `frame`); the
  body ends when the request is complete (an empty final response adds no frame).

A client that disconnects while its request runs cancels it: `DisconnectWatch`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct

from tritonclient.grpc import model_config_pb2

from shm.datatypes import from_config
from shm.errors import HTTP_STATUS, ErrorCode, InferError

from . import http_codec
from .header_forward import forward_into
from .types import DataPlane, DecodedInput, DecodedRequest, InferResult

log = logging.getLogger(__name__)

_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"
# one frame of infer_stream: <u64 frame bytes><u64 JSON header bytes>, then the frame
INFER_STREAM_TYPE = b"application/vnd.shmserve.infer-stream"
_FRAME_HEAD = struct.Struct("<QQ")
_DATA_TYPE_NAME = model_config_pb2.DataType.Name


class DisconnectWatch:
    """Cancels the current task if the client disconnects while its request runs
    (start it once the body has been read; `stop()` it before answering). The task
    then sees CancelledError; `gone` tells it that this is why, so it ends quietly.

    With `delay` (seconds) the watching starts only then, so a request answered sooner
    costs a timer, not a task; a client gone meanwhile is seen at once then."""

    __slots__ = ("gone", "_task", "_receive", "_watcher", "_timer")

    def __init__(self, receive, delay: float = 0.0):
        self.gone = False
        self._task = asyncio.current_task()
        self._receive = receive
        self._watcher = self._timer = None
        if delay:
            self._timer = asyncio.get_running_loop().call_later(delay, self._start)
        else:
            self._start()

    def _start(self) -> None:
        self._timer = None
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self._task.cancel()
                return

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()


async def read_body(receive) -> bytes | None:
    """The whole request body; None if the client went away first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


# ---------------------------------------------------------------------- generate


def generate_request(body: bytes, config, model_name: str, version: str) -> DecodedRequest:
    """A generate request JSON -> DecodedRequest (every output, as JSON)."""
    try:
        obj = json.loads(body) if body else {}
    except (ValueError, RecursionError) as exc:  # nested past json's stack: malformed
        raise InferError(ErrorCode.INVALID_ARG,
                         f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(obj, dict):
        raise InferError(ErrorCode.INVALID_ARG, "generate request must be a JSON object")
    request_id = obj.get("id", "")
    if not isinstance(request_id, str):
        raise InferError(ErrorCode.INVALID_ARG, "Unable to parse 'id'")
    metadata = {t.name: t for t in config.input}
    batch = [-1] if config.max_batch_size > 0 else []
    inputs, params = [], {}

    def take(key, value):
        tensor = metadata.get(key)
        if tensor is None:
            if isinstance(value, (dict, list)) or value is None:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"parameter '{key}' has invalid type. It should be "
                                 "either 'int', 'bool', or 'string'.")
            params[key] = value
            return
        datatype = from_config(_DATA_TYPE_NAME(tensor.data_type))
        values = value if isinstance(value, list) else [value]
        shape = _generate_shape(key, len(values), batch + [int(d) for d in tensor.dims])
        inputs.append(DecodedInput(key, datatype, shape,
                                   http_codec._json_to_raw(key, datatype, shape, values)))

    for key, value in obj.items():
        if key == "id":
            continue
        if key == "parameters":
            if "parameters" in metadata:
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Keyword 'parameters' for nested schema also given as "
                                 "input tensor name")
            if not isinstance(value, dict):
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Expected JSON object for keyword: 'parameters'")
            for k, v in value.items():
                take(k, v)
        else:
            take(key, value)
    params["binary_data_output"] = False
    return DecodedRequest(model_name, version, request_id, inputs, None, params)


def _generate_shape(name: str, count: int, dims: list[int]) -> list[int]:
    """Triton's rule: fixed dimensions take their share of the elements, the innermost
    variable one the rest, other variable ones 1."""
    shape = list(dims)
    for d in shape:
        if d != -1:
            if d == 0 or count % d:
                raise _no_shape(name)
            count //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise _no_shape(name)
    return shape


def _no_shape(name: str) -> InferError:
    return InferError(ErrorCode.INVALID_ARG, f"The schema can not convert input '{name}' "
                      "to tensor with proper shape")


def generate_response(result: InferResult) -> bytes:
    """One response as the generate extension's JSON object."""
    out = {}
    if result.id:
        out["id"] = result.id
    out["model_name"] = result.model_name
    out["model_version"] = str(result.model_version)
    out.update(result.parameters)
    for tensor in result.outputs:
        if tensor.data is None:
            continue
        values = http_codec._raw_to_json(tensor.name, tensor.datatype, tensor.shape,
                                         tensor.data)
        if values is None:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"output '{tensor.name}' of datatype {tensor.datatype} "
                             "cannot be sent as JSON")
        out[tensor.name] = values[0] if len(values) == 1 else values
    return http_codec.json_dumps(out)


class StreamEndpoint:
    """What the routes of this module share, as raw ASGI: read the body, decode it into
    a request (`decode`, per route) and start it, then send its responses (`respond`,
    per route) while watching the client; an error before the start is a JSON error."""

    def __init__(self, core: DataPlane, header_forward=None):
        self.core = core
        self.header_forward = header_forward  # compiled --http-header-forward-pattern

    async def __call__(self, scope, receive, send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        params = scope["path_params"]
        try:
            request = self.decode(scope, body, params["model_name"],
                                  params.get("version", ""))
            forward_into(request, scope["headers"], self.header_forward)
            stream = self.core.start(request)
        except InferError as e:
            return await send_error(send, e)
        watch = DisconnectWatch(receive)
        try:
            await self.respond(request, stream, send)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
        finally:
            watch.stop()
            stream.cancel()  # a no-op once the final response was read

    def decode(self, scope, body: bytes, name: str, version: str) -> DecodedRequest:
        raise NotImplementedError

    async def respond(self, request: DecodedRequest, stream, send) -> None:
        raise NotImplementedError


class GenerateEndpoint(StreamEndpoint):
    """POST .../generate (`streaming` False) or .../generate_stream."""

    def __init__(self, core: DataPlane, streaming: bool, header_forward=None):
        super().__init__(core, header_forward)
        self.streaming = streaming

    def decode(self, scope, body: bytes, name: str, version: str) -> DecodedRequest:
        for key, value in scope["headers"]:
            if key == b"content-encoding" and value.strip().lower() not in (
                    b"", b"identity"):
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Unsupported content-encoding, only 'identity' is "
                                 "supported.")
        view = self.core.get_model(name, check_version(version))
        return generate_request(body, view.config, name, version)

    async def respond(self, request, stream, send) -> None:
        started = False
        pieces = []  # generate: the responses, to answer the one
        final = False
        while not final:
            result, final = await stream.next()
            if result is None:
                continue  # an empty final adds nothing
            if isinstance(result, InferError):
                status, piece = HTTP_STATUS.get(result.code, 500), http_codec.encode_error(
                    result.message)
            else:
                try:
                    status, piece = 200, generate_response(result)
                except InferError as e:
                    status, piece = HTTP_STATUS.get(e.code, 500), http_codec.encode_error(
                        e.message)
                finally:
                    result.release()
            if not self.streaming:
                if not pieces:
                    first_status = status
                pieces.append(piece)
                continue
            if not started:  # the first response sets the status, as in Triton
                started = True
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", _SSE),
                                        (b"cache-control", b"no-cache")]})
            await send({"type": "http.response.body", "body": b"data: " + piece + b"\n\n",
                        "more_body": True})
        if self.streaming:
            if not started:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", _SSE)]})
            await send({"type": "http.response.body", "body": b""})
            return
        if len(pieces) == 1:
            out = pieces[0]
        else:  # Triton 2.51's answer; the status stays the first response's
            out = http_codec.encode_error(_NOT_ONE_RESPONSE)
        await send({"type": "http.response.start",
                    "status": first_status if pieces else 200,
                    "headers": [(b"content-type", _JSON),
                                (b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})


_NOT_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate "
                     "stream for model that generates various number of responses")


# ------------------------------------------------------------------- infer_stream


def frame(body: bytes, header_length: int) -> bytes:
    """One response of infer_stream: two little-endian u64 (the frame's length after
    them, and its JSON header's length), the JSON header (as `/infer` answers, with
    `parameters.triton_final_response`), then the binary outputs in header order."""
    return _FRAME_HEAD.pack(len(body), header_length) + body


class InferStreamEndpoint(StreamEndpoint):
    """POST .../infer_stream: any model's responses, decoupled or not, as they come."""

    def decode(self, scope, body: bytes, name: str, version: str) -> DecodedRequest:
        header_length = None
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
        check_version(version)
        length = http_codec.parse_header_length(header_length, len(body))
        if length == 0:
            view = self.core.get_model(name, version)
            return http_codec.decode_raw_request(body, view.config, name, version)
        return http_codec.decode_infer_request(body, length, name, version)

    async def respond(self, request, stream, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", INFER_STREAM_TYPE)]})
        final = False
        while not final:
            result, final = await stream.next()
            tail = {"triton_final_response": final}
            if result is None:
                continue  # an empty final: the body's end says the request is complete
            if isinstance(result, InferError):
                out = http_codec.json_dumps({"error": result.message, "parameters": tail})
                piece = frame(out, len(out))
            else:
                try:
                    result.parameters = {**result.parameters, **tail}
                    out, out_length = http_codec.encode_infer_response(result, request)
                except InferError as e:
                    out = http_codec.json_dumps({"error": e.message, "parameters": tail})
                    out_length = None
                finally:
                    result.release()
                piece = frame(out, len(out) if out_length is None else out_length)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def read_frames(data: bytes):
    """Split an infer_stream body into (header_length, frame bytes) pairs (clients)."""
    pos = 0
    while pos < len(data):
        n, header = _FRAME_HEAD.unpack_from(data, pos)
        pos += _FRAME_HEAD.size
        yield header, data[pos:pos + n]
        pos += n


# ----------------------------------------------------------------------- helpers


def check_version(version: str) -> str:
    if version and not version.isdigit():
        raise InferError(
            ErrorCode.INVALID_ARG,
            f"failed to get model version from specified version string '{version}', "
            "version should be an integral value > 0")
    return version


async def send_error(send, err: InferError) -> None:
    out = http_codec.encode_error(err.message)
    await send({"type": "http.response.start", "status": HTTP_STATUS.get(err.code, 500),
                "headers": [(b"content-type", _JSON),
                            (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})
