"""Triton's system and CUDA shared-memory extensions: the HTTP routes and the gRPC RPCs.

Protocol only. Every call becomes one `core.shm_call(op, kind, ...)`, which the
scheduler answers (it is the one registry, and it enforces `--allow-client-shm`, the
bounds and name clashes); this module parses and checks the wire forms and renders the
answers and errors as Triton does:

    GET  /v2/{systemsharedmemory|cudasharedmemory}[/region/{name}]/status
    POST /v2/{systemsharedmemory|cudasharedmemory}/region/{name}/register
    POST /v2/{systemsharedmemory|cudasharedmemory}[/region/{name}]/unregister

and Triton's SystemSharedMemory{Status,Register,Unregister} and
CudaSharedMemory{Status,Register,Unregister} RPCs. An empty name means every region of
the kind (status, unregister), so registering needs one.
"""

from __future__ import annotations

import base64
import binascii
import logging

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tritonclient.grpc import service_pb2

from shm.errors import HTTP_STATUS, ErrorCode, InferError
from shm.messages.regions import CUDA, CUDA_IPC_HANDLE_BYTES, SYSTEM

from .grpc_codec import grpc_status
from .http_codec import JSON_ERRORS, encode_error, json_dumps, json_loads
from .types import DataPlane

log = logging.getLogger(__name__)

_INVALID = ErrorCode.INVALID_ARG
_PREFIX = {SYSTEM: "/v2/systemsharedmemory", CUDA: "/v2/cudasharedmemory"}
_ANY_METHOD = ("GET", "POST", "PUT", "DELETE", "PATCH")


def _bad(message: str) -> InferError:
    return InferError(_INVALID, message)


def _need_name(kind: str, name: str) -> None:
    if not name:  # "" would mean "every region" to the registry
        raise _bad(f"'region name' is necessary to register {kind} shared memory region")


def _check_handle(raw_handle: bytes) -> bytes:
    if len(raw_handle) != CUDA_IPC_HANDLE_BYTES:
        raise _bad("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return raw_handle


# ------------------------------------------------------------------------------ HTTP


def http_routes(core: DataPlane) -> list[Route]:
    """Starlette routes for both extensions. They take any method and answer a wrong
    one with 405 and a JSON error, as Triton does (starlette's own 405 is plain text)."""
    routes = []
    for kind, prefix in _PREFIX.items():
        for action in ("status", "register", "unregister"):
            handler = _http_handler(core, kind, action)
            for path in (f"{prefix}/{action}", f"{prefix}/region/{{name}}/{action}"):
                routes.append(Route(path, handler, methods=_ANY_METHOD))
    return routes


def _http_handler(core: DataPlane, kind: str, action: str):
    method = "GET" if action == "status" else "POST"

    async def handle(request: Request) -> Response:
        if request.method != method:
            return _json_response(encode_error("Method Not Allowed"), 405)
        name = request.path_params.get("name", "")
        try:
            if action == "status":
                regions = await core.shm_call("status", kind, name=name)
                return _json_response(json_dumps([status_json(kind, r) for r in regions]))
            if action == "register":
                _need_name(kind, name)
                fields = parse_register_body(kind, await request.body())
                await core.shm_call("register", kind, name=name, **fields)
            else:
                await core.shm_call("unregister", kind, name=name)
        except InferError as e:
            return _json_response(encode_error(e.message), HTTP_STATUS.get(e.code, 500))
        except Exception as e:  # a bug, not the client's fault: answer, keep serving
            log.exception("%s shared memory %s failed", kind, action)
            return _json_response(encode_error(f"internal error: {e}"), 500)
        return _json_response(b"")

    return handle


def _json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def status_json(kind: str, region) -> dict:
    """One entry of a status answer (a shm.messages.regions.RegionStatus), with the
    fields Triton's SharedMemoryManager::GetStatus writes for the kind."""
    if kind == CUDA:
        return {"name": region.name, "device_id": region.device_id,
                "byte_size": region.byte_size}
    return {"name": region.name, "key": region.key, "offset": region.offset,
            "byte_size": region.byte_size}


def parse_register_body(kind: str, body: bytes) -> dict:
    """A register request's JSON body -> shm_call keyword arguments; raises
    InferError(INVALID_ARG) for anything malformed.

    system: {"key": str, "offset": uint (optional, 0), "byte_size": uint}
    cuda:   {"raw_handle": {"b64": str}, "device_id": uint, "byte_size": uint}"""
    try:
        request = json_loads(body)
    except JSON_ERRORS as e:
        raise _bad(f"failed to parse the request JSON buffer: {e}")
    if type(request) is not dict:
        raise _bad("failed to parse the request JSON buffer: expected a JSON object")
    if kind == SYSTEM:
        key = _required(request, "key")
        if type(key) is not str:
            raise _bad("Unable to parse 'key': expected a string")
        return {"key": key, "offset": _uint("offset", request.get("offset", 0)),
                "byte_size": _uint("byte_size", _required(request, "byte_size"))}
    handle = _required(request, "raw_handle")
    b64 = handle.get("b64") if type(handle) is dict else None
    if type(b64) is not str:
        raise _bad("Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("Unable to parse 'raw_handle': invalid base64 encoding")
    return {"raw_handle": _check_handle(raw),
            "device_id": _uint("device_id", _required(request, "device_id")),
            "byte_size": _uint("byte_size", _required(request, "byte_size"))}


def _required(request: dict, field: str):
    if field not in request:
        raise _bad(f"Shared memory register request has no '{field}' field")
    return request[field]


def _uint(field: str, value) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:  # Triton's fields are uint64
        raise _bad(f"Unable to parse '{field}': expected a non-negative integer")
    return value


# ------------------------------------------------------------------------------ gRPC


def grpc_method_handlers(core: DataPlane) -> dict[str, grpc.RpcMethodHandler]:
    """Handlers for the six shared-memory RPCs of inference.GRPCInferenceService."""
    rpcs = _Rpcs(core)
    s = service_pb2

    def unary(fn, request_type):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString())

    return {
        "SystemSharedMemoryStatus": unary(rpcs.system_status, s.SystemSharedMemoryStatusRequest),
        "SystemSharedMemoryRegister": unary(rpcs.system_register,
                                            s.SystemSharedMemoryRegisterRequest),
        "SystemSharedMemoryUnregister": unary(rpcs.system_unregister,
                                              s.SystemSharedMemoryUnregisterRequest),
        "CudaSharedMemoryStatus": unary(rpcs.cuda_status, s.CudaSharedMemoryStatusRequest),
        "CudaSharedMemoryRegister": unary(rpcs.cuda_register,
                                          s.CudaSharedMemoryRegisterRequest),
        "CudaSharedMemoryUnregister": unary(rpcs.cuda_unregister,
                                            s.CudaSharedMemoryUnregisterRequest),
    }


class _Rpcs:
    """The RPC bodies; errors abort the call with the code's gRPC status."""

    def __init__(self, core: DataPlane):
        self.core = core

    async def _call(self, context, op: str, kind: str, **fields) -> list:
        try:
            if op == "register":
                _need_name(kind, fields["name"])
                if kind == CUDA:
                    _check_handle(fields["raw_handle"])
            return await self.core.shm_call(op, kind, **fields)
        except InferError as e:
            error = e
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            log.exception("%s shared memory %s failed", kind, op)
            error = InferError(ErrorCode.INTERNAL, f"internal error: {e}")
        await context.abort(grpc_status(error.code), error.message)

    async def system_status(self, request, context):
        regions = await self._call(context, "status", SYSTEM, name=request.name)
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return response

    async def system_register(self, request, context):
        await self._call(context, "register", SYSTEM, name=request.name, key=request.key,
                         offset=request.offset, byte_size=request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def system_unregister(self, request, context):
        await self._call(context, "unregister", SYSTEM, name=request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def cuda_status(self, request, context):
        regions = await self._call(context, "status", CUDA, name=request.name)
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r.name].CopyFrom(
                service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, device_id=r.device_id, byte_size=r.byte_size))
        return response

    async def cuda_register(self, request, context):
        await self._call(context, "register", CUDA, name=request.name,
                         raw_handle=request.raw_handle, device_id=request.device_id,
                         byte_size=request.byte_size)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def cuda_unregister(self, request, context):
        await self._call(context, "unregister", CUDA, name=request.name)
        return service_pb2.CudaSharedMemoryUnregisterResponse()
