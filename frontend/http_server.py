"""The HTTP/REST server: KServe v2 endpoints with Triton's extensions, on starlette.

`make_http_app(core)` builds the app; uvicorn serves it. The infer route is a raw ASGI
endpoint (no starlette Request/Response objects, no middleware of ours): it reads the
body, decodes it, awaits `core.infer`, encodes and sends, so the per-request Python work
is what the protocol needs and little else. Errors are `{"error": "<message>"}` with the
status that shm.errors.HTTP_STATUS gives the error's code.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from shm.datatypes import from_config
from shm.errors import HTTP_STATUS, ErrorCode, InferError
from shm.header_pattern import compile_forward_pattern

from . import EXTENSIONS, http_codec, repository_endpoints, settings_endpoints, shm_endpoints
from .http_stream import (DisconnectWatch, GenerateEndpoint, InferStreamEndpoint,
                          check_version)
from .header_forward import forward_into
from .restricted import (HTTP_DEFAULT_MAX_INPUT_SIZE, Restrictions, http_refusal,
                         input_size_message)
from .types import BODY_IN_ARENA_MIN, DataPlane, ModelReadyState, ModelView, not_ready_error

logger = logging.getLogger(__name__)


_JSON = b"application/json"
_OCTET = b"application/octet-stream"


def make_http_app(core: DataPlane, *, server_name: str = "shmserve",
                  server_version: str = "0.1.0",
                  extensions: Iterable[str] = EXTENSIONS,
                  routes: Sequence[BaseRoute] = (), header_forward: str = "",
                  restrictions: Restrictions | None = None,
                  max_input_size: int = HTTP_DEFAULT_MAX_INPUT_SIZE) -> Starlette:
    """The HTTP app over `core`, with the shared-memory extensions' routes. `routes`
    are appended (repository, statistics, ... endpoints served by other modules).
    `restrictions` ({group: (header, value)}) and `max_input_size` apply to every
    route, these and any added later (frontend.restricted holds the route table)."""
    metadata = http_codec.json_dumps(
        {"name": server_name, "version": server_version, "extensions": list(extensions)})
    forward = compile_forward_pattern(header_forward)
    infer = InferEndpoint(core, forward, max_input_size)
    handlers = _Handlers(core, metadata)
    model = "/v2/models/{model_name}"
    versioned = model + "/versions/{version}"
    all_routes = [
        # the hot route first: starlette tries routes in order
        Route(model + "/infer", infer, methods=["POST"]),
        Route(versioned + "/infer", infer, methods=["POST"]),
        *(Route(path + suffix, endpoint, methods=["POST"])
          for path in (model, versioned)
          for suffix, endpoint in (
              ("/generate", GenerateEndpoint(core, False, forward)),
              ("/generate_stream", GenerateEndpoint(core, True, forward)),
              ("/infer_stream", InferStreamEndpoint(core, forward)))),
        # before the model routes: "stats" is not a model name here, as in Triton
        Route("/v2/models/stats", handlers.statistics),
        Route(model + "/stats", handlers.statistics),
        Route(versioned + "/stats", handlers.statistics),
        Route("/v2/health/live", handlers.live),
        Route("/v2/health/ready", handlers.ready),
        Route("/v2", handlers.server_metadata),
        Route(model, handlers.model_metadata),
        Route(versioned, handlers.model_metadata),
        Route(model + "/ready", handlers.model_ready),
        Route(versioned + "/ready", handlers.model_ready),
        Route(model + "/config", handlers.model_config),
        Route(versioned + "/config", handlers.model_config),
        *shm_endpoints.http_routes(core),
        *settings_endpoints.http_routes(core),
        *repository_endpoints.http_routes(core),
        *routes,
    ]
    return _HttpApp(infer, restrictions or {}, max_input_size, routes=all_routes,
                    exception_handlers={HTTPException: _http_exception})


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no route: 404; a route without the method: 405) in
    Triton's form, `{"error": "Not Found"}` (its words too), so a client that reads
    every error as JSON reads these. Triton labels them text/plain; we say what the
    body is. 405 keeps its Allow header (RFC 9110, 15.5.6)."""
    return Response(http_codec.encode_error(exc.detail), exc.status_code,
                    headers=exc.headers, media_type="application/json")


class _HttpApp(Starlette):
    """Starlette, with POST .../infer sent straight to its endpoint.

    Routing through starlette's middleware and route list costs ~6 us a request
    (measured); the infer path is recognised here with two string tests instead. Every
    other request, and any infer path this does not recognise, goes the usual way.
    transport/http1.py's native transport uses `infer`, `restrictions` and `max_input`
    for its own fast path and hands every other request to this app."""

    def __init__(self, infer: "InferEndpoint", restrictions: Restrictions,
                 max_input_size: int, **kwargs):
        super().__init__(**kwargs)
        self.infer = infer
        self.restrictions = restrictions
        self.max_input = max_input_size

    async def __call__(self, scope, receive, send) -> None:
        # Restricted API groups first, before any routing or reading (Triton checks
        # the header before anything else a handler does).
        if self.restrictions and scope["type"] == "http":
            refused = http_refusal(scope, self.restrictions)
            if refused is not None:
                return await _send_error(send, 403, refused[1])
        if scope["type"] == "http" and scope["method"] == "POST":
            target = infer_target(scope["path"])
            if target is not None:
                scope["path_params"] = ({"model_name": target[0]} if not target[1] else
                                        {"model_name": target[0], "version": target[1]})
                return await self.infer(scope, receive, send)
        if scope["type"] == "http":
            receive = await _limited_body(scope, receive, send, self.max_input)
            if receive is None:
                return  # refused (too large) or the client went away
        await super().__call__(scope, receive, send)


def infer_target(path: str) -> tuple[str, str] | None:
    """(model, version or "") when `path` is /v2/models/<m>[/versions/<v>]/infer."""
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        parts = path[11:-6].split("/")
        if len(parts) == 1 and parts[0]:
            return parts[0], ""
        if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
            return parts[0], parts[2]
    return None


async def _send_error(send, status: int, message: str, close: bool = False) -> None:
    out = http_codec.encode_error(message)
    headers = [(b"content-type", _JSON), (b"content-length", b"%d" % len(out))]
    if close:  # the body was not read: end the connection rather than drain it
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def _request_lengths(scope) -> tuple[int | None, str | None]:
    """(Content-Length or None, Inference-Header-Content-Length or None)."""
    length = header = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            length = int(value) if value.isdigit() else None
        elif key == b"inference-header-content-length":
            header = value.decode("latin-1")
    return length, header


async def _limited_body(scope, receive, send, limit: int):
    """`receive` for a route that is not the infer fast path, under the input size
    limit: a declared Content-Length over it is refused before a byte is read; a body
    without one (chunked) is read up to the limit and replayed, or refused as soon as it
    passes it. None when refused (answered here) or when the client went away."""
    length, header = _request_lengths(scope)
    if length is not None:
        if length > limit:
            await _send_error(send, 400, input_size_message(length, limit, header), True)
            return None
        return receive
    if not any(k == b"transfer-encoding" for k, _ in scope["headers"]):
        return receive  # no body at all (a GET, or an empty POST)
    chunks, total = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            await _send_error(send, 400, input_size_message(total, limit, header), True)
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replayed():
        return replay.pop() if replay else await receive()
    return replayed


def error_response(err: InferError) -> Response:
    return Response(http_codec.encode_error(err.message),
                    status_code=HTTP_STATUS.get(err.code, 500),
                    media_type="application/json")


def infer_headers(headers) -> tuple[str | None, str | None, str | None, int]:
    """(Inference-Header-Content-Length, Content-Encoding, Accept-Encoding,
    Content-Length or 0) of an infer request's [(lowercase name, value)] headers."""
    header_length = encoding = accept = None
    content_length = 0
    for key, value in headers:
        if key == b"inference-header-content-length":
            header_length = value.decode("latin-1")
        elif key == b"content-encoding":
            encoding = value.decode("latin-1").strip()
        elif key == b"accept-encoding":
            accept = value.decode("latin-1")
        elif key == b"content-length":
            content_length = int(value) if value.isdigit() else 0
    return header_length, encoding, accept, content_length


class InferEndpoint:
    """POST /v2/models/{model}[/versions/{version}]/infer: as a raw ASGI app (under
    uvicorn), and through `respond` for transport/http1.py's native transport, which
    reads the body and writes the answer itself. Both share the decoding, the call
    to the core and the response building here."""

    def __init__(self, core: DataPlane, header_forward=None,
                 max_input_size: int = HTTP_DEFAULT_MAX_INPUT_SIZE):
        self.core = core
        self.header_forward = header_forward  # compiled --http-header-forward-pattern
        self.max_input = max_input_size  # --http-max-input-size, bytes
        self.memo = http_codec.HeaderMemo()  # the JSON headers decoded last
        # the core's arena, for bodies received straight into shared memory, and each
        # connection's share of it (body_quota(); uvicorn's connections have none)
        self.body_buffer = core.body_buffer
        self.body_quota = core.body_quota

    def arena_body(self, content_length: int, encoding) -> bool:
        """Whether a body of this length is received straight into the arena."""
        return content_length >= BODY_IN_ARENA_MIN and not encoding

    async def __call__(self, scope, receive, send) -> None:
        header_length, encoding, accept, content_length = infer_headers(scope["headers"])
        limit = self.max_input
        if content_length > limit:  # refused before a byte of the body is read
            return await _send_error(
                send, 400, input_size_message(content_length, limit, header_length), True)

        # A large body goes straight into the core's shared-memory arena as it arrives:
        # its tensors are then already where the worker reads them (no second copy, and
        # no fresh multi-MiB allocation whose page faults cost more than the copy).
        block = got = None
        if self.arena_body(content_length, encoding):
            # None past the arena's budget for bodies: read into process memory below
            got = self.body_buffer(content_length)
        if got is not None:
            body, block = got
            filled = await _receive_into(receive, body)
            if filled is None:
                self.core.free_blocks([block])
                return  # client went away
            if filled != content_length:
                body = body[:filled]
        else:
            # the body: usually one message; join only when it came in pieces
            message = await receive()
            body = message.get("body", b"")
            if message.get("more_body", False):
                chunks, total = [body], len(body)
                while message.get("more_body", False) and total <= limit:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # client went away
                    chunk = message.get("body", b"")
                    total += len(chunk)
                    if total > limit:  # a chunked body: stop reading at the limit
                        return await _send_error(
                            send, 400, input_size_message(total, limit, header_length),
                            True)
                    chunks.append(chunk)
                if total > limit:
                    return await _send_error(
                        send, 400, input_size_message(total, limit, header_length), True)
                body = b"".join(chunks)
            elif message["type"] != "http.request":
                return
        params = scope["path_params"]
        # a client that disconnects meanwhile cancels the request (watched from
        # 20 ms on: most requests are answered before, at the cost of a timer)
        answer = await self.respond(
            params["model_name"], params.get("version", ""), scope["headers"], body,
            block, header_length, encoding, accept,
            lambda: DisconnectWatch(receive, delay=0.02))
        if answer is None:
            return
        status, headers, out = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    async def respond(self, name: str, version: str, raw_headers, body, block,
                      header_length, encoding, accept, watch):
        """(status, headers with content-length, body) of the infer request `body`
        (`block`: the arena block it lies in, or None); None when the client went
        away meanwhile. `watch()` starts watching for that (a DisconnectWatch-like
        object: `gone`, `stop()`), once the request is on its way to the core.
        transport/http1.py runs the same steps without a coroutine where the body
        needs no inflating: prepare, the core's start_unary, answer or error_answer."""
        try:
            if encoding:
                if version:
                    check_version(version)  # refused before any inflating
                body = await http_codec.decompress_async(body, encoding, self.max_input)
            request = self.prepare(name, version, raw_headers, body, block,
                                   header_length)
            block = None  # the core frees it from here on
            watcher = watch()
            try:
                result = await self.core.infer(request, _DECOUPLED_REFUSAL)
            except asyncio.CancelledError:
                if watcher.gone:
                    return None
                raise
            finally:
                watcher.stop()
            return self.answer(name, version, request, result, accept)
        except Exception as e:  # noqa: BLE001 - every failure is answered
            if block is not None:  # the request failed before the core took the body
                self.core.free_blocks([block])
            return self.error_answer(e, name, encoding)

    def prepare(self, name: str, version: str, raw_headers, body, block, header_length):
        """The DecodedRequest of the infer request `body`, its arena `block` (or
        None) handed to it as the last step. Raises InferError for a body that cannot
        be decoded; the block is then still the caller's."""
        if version:
            version = check_version(version)
        length = http_codec.parse_header_length(header_length, len(body))
        if length == 0:
            view = self.core.get_model(name, version)
            request = http_codec.decode_raw_request(body, view.config, name, version)
        else:
            request = self.memo.decode(body, length, name, version)[0]
        forward_into(request, raw_headers, self.header_forward)
        if block is not None:
            request.arena_blocks.append(block)
        return request

    def start(self, request, on_done):
        """The core's start_unary for a prepared request, with HTTP's refusal of a
        decoupled model: its handle (`cancel()`), and `on_done(answer)` later."""
        return self.core.start_unary(request, on_done, _DECOUPLED_REFUSAL)

    def answer(self, name: str, version: str, request, result, accept):
        """(status, headers with content-length, body) of `result`, which is released
        here. Raises InferError where the outputs cannot be encoded."""
        try:
            batching, labels = False, None
            for o in request.outputs or ():
                if o.class_count:  # classification: the model's labels, batching
                    view = self.core.get_model(name, version)
                    batching = view.config.max_batch_size > 0
                    labels = view.labels
                    break
            out, out_length = http_codec.encode_infer_response(
                result, request, batching=batching, labels=labels)
        finally:
            result.release()
        if out_length is None:
            headers = [(b"content-type", _JSON)]
        else:
            headers = [(b"content-type", _OCTET),
                       (b"inference-header-content-length", b"%d" % out_length)]
        if accept:
            chosen = http_codec.accepted_encoding(accept)
            if chosen:
                out = http_codec.compress(out, chosen)
                headers.append((b"content-encoding", chosen.encode()))
        headers.append((b"content-length", b"%d" % len(out)))
        return 200, headers, out

    def error_answer(self, error: Exception, name: str, encoding):
        """(status, headers with content-length, body) of a request that failed:
        an InferError in its status and words, anything else (a bug, a dead peer) a
        500 that names it, logged."""
        if isinstance(error, InferError):
            status = HTTP_STATUS.get(error.code, 500)
            out = http_codec.encode_error(error.message)
            headers = [(b"content-type", _JSON)]
            if error.code == ErrorCode.UNSUPPORTED and encoding:
                headers.append((b"accept-encoding", b"gzip, deflate"))
        else:
            logger.error("inference on model '%s' failed", name, exc_info=error)
            status = 500
            out = http_codec.encode_error(f"{type(error).__name__}: {error}")
            headers = [(b"content-type", _JSON)]
        headers.append((b"content-length", b"%d" % len(out)))
        return status, headers, out


async def _receive_into(receive, buffer: memoryview) -> int | None:
    """Copy the request body into `buffer` as it arrives; None if the client left.
    Returns the number of bytes received (at most len(buffer); extra bytes are counted
    but dropped, so a body longer than its Content-Length is reported, not written)."""
    pos, size = 0, len(buffer)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        n = len(chunk)
        if n:
            end = min(pos + n, size)
            buffer[pos:end] = chunk[:end - pos]
            pos += n
        if not message.get("more_body", False):
            return min(pos, size) if pos <= size else pos


_DECOUPLED_REFUSAL = ("HTTP end point doesn't support models with decoupled transaction "
                      "policy")


class _Handlers:
    """The non-inference endpoints; plain starlette handlers (not on the hot path)."""

    def __init__(self, core: DataPlane, metadata: bytes):
        self.core = core
        self.metadata = metadata

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if self.core.server_live() else 400)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.core.server_ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return Response(self.metadata, media_type="application/json")

    def _ready_model(self, request: Request) -> ModelView:
        name = request.path_params["model_name"]
        version = check_version(request.path_params.get("version", ""))
        view = self.core.get_model(name, version)
        # Triton core's ModelLifeCycle::GetModel wording
        if view.state != ModelReadyState.READY:
            raise not_ready_error(view, version, why=False)
        return view

    async def model_metadata(self, request: Request) -> Response:
        try:
            view = self._ready_model(request)
        except InferError as e:
            return error_response(e)
        if request.path_params.get("version"):
            versions = [str(view.version)]
        else:
            versions = sorted((v.version for v in self.core.model_versions(view.name)
                               if v.state == ModelReadyState.READY), key=int) or [view.version]
            versions = [str(v) for v in versions]
        return Response(http_codec.json_dumps(model_metadata(view.config, versions)),
                        media_type="application/json")

    async def model_ready(self, request: Request) -> Response:
        try:
            view = self._ready_model(request)
        except InferError as e:
            if e.code == ErrorCode.INVALID_ARG:
                return error_response(e)
            # Triton answers "not ready" for unknown and unavailable models alike
            view = None
        if view is None:
            return Response(http_codec.encode_error("Model version not ready"),
                            status_code=400, media_type="application/json")
        return Response(status_code=200)

    async def statistics(self, request: Request) -> Response:
        try:
            version = check_version(request.path_params.get("version", ""))
            body = await self.core.model_statistics(
                request.path_params.get("model_name", ""), version)
        except InferError as e:
            return error_response(e)
        return Response(body, media_type="application/json")

    async def model_config(self, request: Request) -> Response:
        try:
            view = self._ready_model(request)
        except InferError as e:
            return error_response(e)
        config = view.config_json
        if config is None:
            from google.protobuf.json_format import MessageToDict

            config = MessageToDict(view.config, preserving_proto_field_name=True)
        return Response(http_codec.json_dumps(config), media_type="application/json")


def model_metadata(config, versions: list[str]) -> dict:
    """Triton's model metadata: inputs/outputs with protocol datatypes and, for a model
    that batches, a leading -1 in each shape."""
    from tritonclient.grpc import model_config_pb2

    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(items):
        return [{"name": t.name,
                 "datatype": from_config(model_config_pb2.DataType.Name(t.data_type)),
                 "shape": batch + [int(d) for d in t.dims]} for t in items]

    return {
        "name": config.name,
        "versions": versions,
        "platform": config.platform or config.backend,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
    }
