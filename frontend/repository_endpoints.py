"""The model-repository extension over HTTP and gRPC.

Protocol only: each call's parameters are taken from the protocol's own form (JSON
with base64 file contents over HTTP, ModelRepositoryParameter over gRPC) and handed to
the scheduler, whose model manager does the work and answers.

    POST /v2/repository/index                      gRPC RepositoryIndex
    POST /v2/repository/models/{model}/load        gRPC RepositoryModelLoad
    POST /v2/repository/models/{model}/unload      gRPC RepositoryModelUnload
"""

from __future__ import annotations

import base64
import binascii

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tritonclient.grpc import service_pb2

from shm.errors import HTTP_STATUS, ErrorCode, InferError

from .grpc_codec import grpc_status
from .http_codec import JSON_ERRORS, encode_error, json_dumps, json_loads
from .types import DataPlane

FILE_PREFIX = "file:"


def index_json(entries) -> list[dict]:
    """Index rows as Triton's JSON: a model never loaded has only its name; version
    and reason appear only when set."""
    rows = []
    for e in entries:
        row = {"name": e.name}
        if e.version:
            row["version"] = str(e.version)
        if e.state:
            row["state"] = e.state
        if e.reason:
            row["reason"] = e.reason
        rows.append(row)
    return rows


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _error(err: InferError) -> Response:
    return _json(encode_error(err.message), HTTP_STATUS.get(err.code, 500))


def _body(raw: bytes) -> dict:
    """The request's JSON object; an empty body (or any JSON that is not an object,
    which Triton ignores too) is an empty one."""
    if not raw.strip():
        return {}
    try:
        body = json_loads(raw)
    except JSON_ERRORS as e:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"failed to parse the request JSON buffer: {e}") from None
    return body if type(body) is dict else {}


def _parameters(body: dict) -> dict:
    params = body.get("parameters", {})
    if type(params) is not dict:
        raise InferError(ErrorCode.INVALID_ARG, "Expected 'parameters' to be a JSON object")
    return params


def http_load_arguments(params: dict) -> tuple[str | None, dict[str, bytes]]:
    """A load's JSON parameters -> (config override, files). Triton reads `config` and
    every `file:` parameter as strings, the files base64-encoded."""
    config = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if key != "config" and not key.startswith(FILE_PREFIX):
            continue  # other parameters are not the load's business
        if type(value) is not str:
            # Triton's JSON parser's words for a non-string where it wants one
            raise InferError(ErrorCode.INTERNAL,
                             "attempt to access JSON non-string as string")
        if key == "config":
            config = value
            continue
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"failed to decode the base64 content of parameter "
                             f"'{key}'") from None
    return config, files


def http_routes(core: DataPlane) -> list[Route]:
    async def index(request: Request) -> Response:
        try:
            body = _body(await request.body())
            ready = body.get("ready", False)
            if type(ready) is not bool:
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Unable to parse 'ready' field: expected a boolean")
            entries = await core.repository_index(ready)
        except InferError as e:
            return _error(e)
        return _json(json_dumps(index_json(entries)))

    async def load(request: Request) -> Response:
        try:
            config, files = http_load_arguments(_parameters(_body(await request.body())))
            await core.repository_load(request.path_params["model_name"], config, files)
        except InferError as e:
            return _error(e)
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        try:
            params = _parameters(_body(await request.body()))
            dependents = params.get("unload_dependents", False)
            if type(dependents) is not bool:
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Expected 'unload_dependents' to be a boolean")
            await core.repository_unload(request.path_params["model_name"], dependents)
        except InferError as e:
            return _error(e)
        return Response(status_code=200)

    return [Route("/v2/repository/index", index, methods=["POST"]),
            Route("/v2/repository/models/{model_name}/load", load, methods=["POST"]),
            Route("/v2/repository/models/{model_name}/unload", unload, methods=["POST"])]


# -- gRPC -------------------------------------------------------------------------------

def grpc_load_arguments(parameters) -> tuple[str | None, dict[str, bytes]]:
    """RepositoryModelLoadRequest.parameters -> (config override, files): `config` a
    string_param, each `file:` a bytes_param, as tritonclient sends them."""
    config = None
    files: dict[str, bytes] = {}
    for key, param in parameters.items():
        if key == "config":
            if param.WhichOneof("parameter_choice") != "string_param":
                raise InferError(ErrorCode.INVALID_ARG,
                                 "Load parameter 'config' must be a string")
            config = param.string_param
        elif key.startswith(FILE_PREFIX):
            if param.WhichOneof("parameter_choice") != "bytes_param":
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"Load parameter '{key}' must be bytes")
            files[key] = param.bytes_param
    return config, files


def grpc_method_handlers(core: DataPlane) -> dict[str, grpc.RpcMethodHandler]:
    async def index(request, context):
        try:
            entries = await core.repository_index(request.ready)
        except InferError as e:
            await context.abort(grpc_status(e.code), e.message)
        response = service_pb2.RepositoryIndexResponse()
        for row in index_json(entries):
            response.models.add(**row)
        return response

    async def load(request, context):
        try:
            config, files = grpc_load_arguments(request.parameters)
            await core.repository_load(request.model_name, config, files)
        except InferError as e:
            await context.abort(grpc_status(e.code), e.message)
        return service_pb2.RepositoryModelLoadResponse()

    async def unload(request, context):
        param = request.parameters.get("unload_dependents")
        dependents = bool(param is not None and param.bool_param)
        try:
            await core.repository_unload(request.model_name, dependents)
        except InferError as e:
            await context.abort(grpc_status(e.code), e.message)
        return service_pb2.RepositoryModelUnloadResponse()

    def unary(fn, request_type):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString())

    return {"RepositoryIndex": unary(index, service_pb2.RepositoryIndexRequest),
            "RepositoryModelLoad": unary(load, service_pb2.RepositoryModelLoadRequest),
            "RepositoryModelUnload": unary(unload, service_pb2.RepositoryModelUnloadRequest)}
