"""The gRPC front door: Triton's `inference.GRPCInferenceService` over a DataPlane.

`handler_table` builds every RPC's handler once; main.py hands the table to an engine
(transport.engines.grpc_engine: the native one, or grpc.aio). Handlers are
registered as generic method handlers with no (de)serializers on the inference RPCs,
so `grpc_codec` sees the wire bytes: it slices large raw inputs out of the request
without protobuf copying them, and writes outputs into the reply with one copy. The
other RPCs use the generated message classes (the shared-memory ones come from
`shm_endpoints`, the logging and trace ones from `settings_endpoints`). RPCs this
server does not offer yet answer UNIMPLEMENTED.

The port is bound with SO_REUSEPORT so that every frontend process listens on it and
the kernel spreads connections between them; message size limits are raised to 2 GiB
as Triton does. Keepalive, PING abuse and connection age (transport.h2_keepalive) and
TLS (frontend.grpc_tls) are Triton's flags, on either engine.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from shm.datatypes import from_config
from shm.errors import ErrorCode, InferError
from shm.header_pattern import compile_forward_pattern

from . import (EXTENSIONS, classification, grpc_codec, grpc_health, repository_endpoints,
               settings_endpoints, shm_endpoints)
from .header_forward import forward_into
from .transport.engines import GrpcService
from .stream_slots import ConnectionSlots
from .transport.h2_limits import Limits
from .types import DataPlane, ModelReadyState, not_ready_error

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"


_DATA_TYPE_NAME = model_config_pb2.DataType.Name


def _default_version() -> str:
    try:
        from importlib.metadata import version
        return version("shmserve")
    except Exception:
        return "0.1.0"


def handler_table(core: DataPlane, *, server_name: str = "shmserve",
                  server_version: str | None = None, extensions=EXTENSIONS,
                  header_forward: str = "") -> GrpcService:
    """Every RPC this server offers ({service: {method: handler}}), built once and
    served by either engine (transport.engines.grpc_engine)."""
    servicer = InferenceServicer(core, server_name, server_version or _default_version(),
                                 extensions, compile_forward_pattern(header_forward))
    table = {SERVICE: servicer.method_handlers(),
             grpc_health.SERVICE: grpc_health.HealthServicer(core).method_handlers()}
    infer = f"/{SERVICE}/ModelInfer"
    return GrpcService(table, arena_paths=(infer,), message_checks={
        path: grpc_codec.malformed_prefix for path in (infer, f"/{SERVICE}/ModelStreamInfer")},
        starters={infer: servicer.start_model_infer})


class InferenceServicer:
    """Handlers for each RPC of inference.GRPCInferenceService, over a DataPlane."""

    def __init__(self, core: DataPlane, server_name: str, server_version: str,
                 extensions, header_forward=None,
                 stream_in_flight_max: int = Limits.max_streams):
        self.core = core
        # requests running at once on one connection's streams (stream_slots.py)
        self.stream_slots = ConnectionSlots(stream_in_flight_max)
        self.header_forward = header_forward  # compiled --grpc-header-forward-pattern
        self.server_metadata = service_pb2.ServerMetadataResponse(
            name=server_name, version=server_version, extensions=list(extensions)
        ).SerializeToString()

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        unary = grpc.unary_unary_rpc_method_handler
        s = service_pb2

        def typed(fn, request_type):
            return unary(fn, request_deserializer=request_type.FromString,
                         response_serializer=_serialize)

        handlers = {
            "ServerLive": typed(self.server_live, s.ServerLiveRequest),
            "ServerReady": typed(self.server_ready, s.ServerReadyRequest),
            "ModelReady": typed(self.model_ready, s.ModelReadyRequest),
            "ServerMetadata": unary(self.server_metadata_rpc,
                                    request_deserializer=None, response_serializer=None),
            "ModelMetadata": typed(self.model_metadata, s.ModelMetadataRequest),
            "ModelConfig": typed(self.model_config, s.ModelConfigRequest),
            "ModelStatistics": typed(self.model_statistics, s.ModelStatisticsRequest),
            # raw bytes in and out: grpc_codec parses and builds the wire form itself
            "ModelInfer": unary(self.model_infer, request_deserializer=None,
                                response_serializer=None),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                self.model_stream_infer, request_deserializer=None, response_serializer=None),
        }
        handlers.update(shm_endpoints.grpc_method_handlers(self.core))
        handlers.update(settings_endpoints.grpc_method_handlers(self.core))
        handlers.update(repository_endpoints.grpc_method_handlers(self.core))
        for method in s.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            if method.name not in handlers:
                handlers[method.name] = unary(_unimplemented(method.name),
                                              request_deserializer=None,
                                              response_serializer=None)
        return handlers

    # -- health and metadata ----------------------------------------------------------

    async def server_live(self, request, context):
        return service_pb2.ServerLiveResponse(live=self.core.server_live())

    async def server_ready(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.core.server_ready())

    async def model_ready(self, request, context):
        # As Triton: an unknown or unavailable model is "not ready", not an error.
        try:
            view = self.core.get_model(request.name, request.version)
        except InferError as e:
            if e.code in (ErrorCode.NOT_FOUND, ErrorCode.UNAVAILABLE):
                return service_pb2.ModelReadyResponse(ready=False)
            await _abort(context, e)
        return service_pb2.ModelReadyResponse(ready=view.state == ModelReadyState.READY)

    async def server_metadata_rpc(self, request, context):
        return self.server_metadata

    async def model_metadata(self, request, context):
        view = await self._ready_model(request.name, request.version, context)
        config = _config_message(view.config)
        versions = [str(v.version) for v in self.core.model_versions(view.name)
                    if v.state == ModelReadyState.READY]
        batch = [-1] if config.max_batch_size > 0 else []
        return service_pb2.ModelMetadataResponse(
            name=view.name,
            versions=versions or [str(view.version)],
            platform=config.platform or config.backend,
            inputs=[_tensor_metadata(t, batch) for t in config.input],
            outputs=[_tensor_metadata(t, batch) for t in config.output],
        )

    async def model_config(self, request, context):
        view = await self._ready_model(request.name, request.version, context)
        return service_pb2.ModelConfigResponse(config=_config_message(view.config))

    async def model_statistics(self, request, context):
        try:
            body = await self.core.model_statistics(request.name, request.version)
        except InferError as e:
            await _abort(context, e)
        return json_format.Parse(body, service_pb2.ModelStatisticsResponse())

    async def _ready_model(self, name: str, version: str, context):
        try:
            view = self.core.get_model(name, version)
        except InferError as e:
            await _abort(context, e)
        # Triton core's ModelLifeCycle::GetModel wording
        if view.state != ModelReadyState.READY:
            await _abort(context, not_ready_error(view, version, why=False))
        return view

    # -- inference --------------------------------------------------------------------

    async def model_infer(self, data: bytes, context) -> bytes:
        try:
            request = self._infer_request(data, context)
            answer = await self.core.infer(request, _DECOUPLED_REFUSAL)
        except InferError as e:
            request, answer = None, e
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            request, answer = None, _internal("ModelInfer", e)
        reply, status = self._infer_reply(request, answer)
        if status is None:
            return reply
        await context.abort(*status)

    def start_model_infer(self, data: bytes, context, done):
        """model_infer without a task or coroutine: the native transport's starter
        for ModelInfer (NativeGrpcServer.starters). Decoded and started here; `done`
        gets the reply, or None and (grpc status, details), once, from the read of the
        response (or now, for a request refused before it ran: None is returned
        then, else the request's handle, whose cancel() drops it)."""
        try:
            request = self._infer_request(data, context)
            return self.core.start_unary(
                request, lambda answer: done(*self._infer_reply(request, answer)),
                _DECOUPLED_REFUSAL)
        except InferError as e:
            error = e
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            error = _internal("ModelInfer", e)
        done(*self._infer_reply(None, error))
        return None

    def _infer_request(self, data: bytes, context):
        """The DecodedRequest of a ModelInfer message, its metadata forwarded and the
        arena block it was received into (the native transport's) handed to it."""
        request = grpc_codec.decode_infer_request(data)
        if self.header_forward is not None:
            forward_into(request, context.invocation_metadata() or (), self.header_forward)
        take = getattr(context, "take_body_block", None)  # the native transport's
        block = take() if take is not None else None
        if block is not None:  # the tensors are views of it: the core frees it
            request.arena_blocks.append(block)
        return request

    def _infer_reply(self, request, answer) -> tuple[bytes | None, tuple | None]:
        """(reply, None) for the core's answer to a ModelInfer (an InferResult,
        released here), or (None, (grpc status, details)) for an error or exception."""
        if isinstance(answer, InferError):
            error = answer
        elif isinstance(answer, BaseException):
            error = _internal("ModelInfer", answer)
        else:
            try:
                if classification.wanted(request.outputs):
                    self._classify(answer, request)
                return grpc_codec.encode_infer_response(answer, request.id), None
            except InferError as e:
                error = e
            except Exception as e:
                error = _internal("ModelInfer", e)
            finally:
                answer.release()
        return None, (grpc_codec.grpc_status(error.code), error.message)

    async def model_stream_infer(self, request_iterator, context) -> None:
        """Bidirectional stream, for every model: each request runs as its own task
        and each of its responses is written as soon as it arrives (a decoupled model's
        as the model sends them), so responses of different requests may interleave
        (clients match them by id, as with Triton). Errors travel in-band, in
        `error_message`; the stream itself stays open, unless the client opened it
        with the header `triton_grpc_error: true` (see _stream_one). A stream the
        client cancels or drops cancels its requests still running."""
        lock = asyncio.Lock()  # one write in flight per call (grpc's rule)
        tasks: set[asyncio.Task] = set()
        md = context.invocation_metadata() or ()
        # Triton's opt-in: the first error response ends the stream as its gRPC status
        failed = (asyncio.get_running_loop().create_future()
                  if _grpc_error_mode(md) else None)

        async def write(reply: bytes) -> None:
            async with lock:
                if failed is not None and failed.done():
                    return  # the stream ends with the error: nothing after it
                await context.write(reply)

        # the stream's metadata, forwarded into each of its requests
        metadata = md if self.header_forward else None

        peer = context.peer()
        slots = self.stream_slots.open(peer)

        def ended(task) -> None:
            tasks.discard(task)
            slots.give()

        async def read() -> None:
            messages = request_iterator.__aiter__()
            while True:
                if not slots.try_take():
                    await slots.take()  # no slot: the stream is not read meanwhile
                try:
                    data = await messages.__anext__()
                except StopAsyncIteration:
                    slots.give()
                    break
                except BaseException:  # cancelled
                    slots.give()
                    raise
                task = asyncio.ensure_future(self._stream_one(data, write, metadata,
                                                              failed))
                tasks.add(task)
                task.add_done_callback(ended)
            if tasks:
                await asyncio.gather(*tasks)

        reader = None
        try:
            if failed is None:
                await read()
                return
            reader = asyncio.ensure_future(read())
            await asyncio.wait((reader, failed), return_when=asyncio.FIRST_COMPLETED)
            if not failed.done():
                failed.cancel()
                return reader.result()
            reader.cancel()  # no more requests are read or answered on this stream
            await asyncio.gather(reader, return_exceptions=True)
            error = failed.result()
            await _abort(context, error)
        finally:
            if reader is not None:
                reader.cancel()  # no-op once done; the call itself was cancelled
            for task in tasks:  # the client went away: stop what it no longer awaits
                task.cancel()
            self.stream_slots.close(peer, slots)

    def _classify(self, result, request) -> None:
        view = self.core.get_model(request.model_name, request.model_version)
        classification.apply(result, request.outputs, view.config.max_batch_size > 0,
                             view.labels)

    async def _stream_one(self, data: bytes, write, metadata=None, failed=None) -> None:
        """Run one request of a stream and write each of its responses. With `failed`
        (the stream's triton_grpc_error mode) an error response of the model sets it
        instead of travelling in-band, and this request says no more; errors found
        before the request runs (unknown model, wrong datatype) stay in-band, as
        Triton 2.51 answers them in that mode too."""
        request_id = ""
        try:
            request = grpc_codec.decode_infer_request(data)
            request_id = request.id
            if metadata is not None:
                forward_into(request, metadata, self.header_forward)
            empty_final = request.parameters.get("triton_enable_empty_final_response")
            if empty_final is not None and not isinstance(empty_final, bool):
                raise InferError(
                    ErrorCode.INVALID_ARG,
                    "invalid value type for 'triton_enable_empty_final_response' "
                    "parameter, expected bool_param.")
            stream = self.core.start(request)
        except InferError as e:
            await write(grpc_codec.encode_stream_error(
                e.message, request_id or grpc_codec.request_id_of(data)))
            return
        except Exception as e:
            await write(grpc_codec.encode_stream_error(
                _internal("ModelStreamInfer", e).message,
                request_id or grpc_codec.request_id_of(data)))
            return
        name, version = stream.view.name, str(stream.view.version)
        try:
            final = False
            while not final:
                try:
                    result, final = await stream.next()
                except Exception as e:  # a bug: report it as the request's last word
                    result, final = _internal("ModelStreamInfer", e), True
                if result is None:  # a decoupled model's send(None, FINAL)
                    if empty_final:  # the version as the request spelled it, as Triton
                        await write(grpc_codec.encode_stream_empty_final(
                            request_id, name, request.model_version))
                    continue
                if isinstance(result, InferError) and failed is not None:
                    _fail_stream(failed, result)
                    return
                if isinstance(result, InferError):
                    await write(grpc_codec.encode_stream_error(
                        result.message, request_id, model_name=name, model_version=version,
                        final=final))
                    continue
                try:
                    if classification.wanted(request.outputs):
                        self._classify(result, request)
                    reply = grpc_codec.encode_stream_response(result, request_id, final)
                except InferError as e:
                    if failed is not None:
                        _fail_stream(failed, e)
                        return
                    reply = grpc_codec.encode_stream_error(
                        e.message, request_id, model_name=name, model_version=version,
                        final=final)
                except Exception as e:
                    reply = grpc_codec.encode_stream_error(
                        _internal("ModelStreamInfer", e).message, request_id,
                        model_name=name, model_version=version, final=final)
                finally:
                    result.release()
                await write(reply)
        finally:
            stream.cancel()  # no-op once the final response was read


# ---------------------------------------------------------------------------- helpers


_DECOUPLED_REFUSAL = ("ModelInfer RPC doesn't support models with decoupled transaction "
                      "policy")


def _grpc_error_mode(metadata) -> bool:
    """Whether the stream's client sent `triton_grpc_error: true` (Triton compares the
    value with "true"; any letter case is taken here)."""
    return any(k == "triton_grpc_error" and isinstance(v, str) and v.lower() == "true"
               for k, v in metadata)


def _fail_stream(failed: asyncio.Future, error: InferError) -> None:
    """The first error response ends a triton_grpc_error stream; later ones say no
    more (the stream's status can carry one)."""
    if not failed.done():
        failed.set_result(error)


def _serialize(message) -> bytes:
    return message.SerializeToString()


def _internal(rpc: str, exc: BaseException) -> InferError:
    log.error("%s failed", rpc, exc_info=exc)  # inside an except block or not
    return InferError(ErrorCode.INTERNAL, f"internal error: {exc}")


async def _abort(context, error: InferError):
    await context.abort(grpc_codec.grpc_status(error.code), error.message)


def _unimplemented(name: str):
    async def handler(request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not supported by this server yet")
    return handler


def _config_message(config):
    """ModelView.config as a ModelConfig message (it may arrive as serialized bytes)."""
    if isinstance(config, (bytes, bytearray, memoryview)):
        return model_config_pb2.ModelConfig.FromString(bytes(config))
    return config


def _tensor_metadata(tensor, batch: list[int]):
    return service_pb2.ModelMetadataResponse.TensorMetadata(
        name=tensor.name,
        datatype=from_config(_DATA_TYPE_NAME(tensor.data_type)),
        shape=batch + list(tensor.dims),
    )
