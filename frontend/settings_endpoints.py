"""The logging and trace extensions over HTTP and gRPC.

Protocol only: each call's values are taken as the client sent them (JSON values, or
the gRPC SettingValue's set field) and forwarded to the scheduler, which validates,
applies and answers with the settings in force.

    GET/POST /v2/logging                                  gRPC LogSettings
    GET/POST /v2/trace/setting                            gRPC TraceSetting
    GET/POST /v2/models/{model}/trace/setting             (model_name set)
"""

from __future__ import annotations

import logging

import grpc
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tritonclient.grpc import service_pb2

from shm.errors import HTTP_STATUS, ErrorCode, InferError

from .grpc_codec import grpc_status
from .http_codec import JSON_ERRORS, encode_error, json_dumps, json_loads
from .types import DataPlane

log = logging.getLogger(__name__)

_ANY_METHOD = ("GET", "POST", "PUT", "DELETE", "PATCH")


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _error(err: InferError) -> Response:
    # Triton's logging and trace endpoints answer a setting they refuse with 400, where
    # its inference routes map UNSUPPORTED to 501
    status = 400 if err.code == ErrorCode.UNSUPPORTED else HTTP_STATUS.get(err.code, 500)
    return _json(encode_error(err.message), status)


def parse_settings_body(body: bytes, what: str) -> dict:
    """A POST body -> its settings object; an empty body is an empty object, as Triton
    allows. Raises InferError(INVALID_ARG) for anything but a JSON object."""
    if not body.strip():
        return {}
    try:
        request = json_loads(body)
    except JSON_ERRORS as e:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"failed to parse the {what} request JSON buffer: {e}") from None
    if type(request) is not dict:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"failed to parse the {what} request JSON buffer: expected a "
                         "JSON object")
    return request


def http_routes(core: DataPlane) -> list[Route]:
    """Routes for both extensions; a method other than GET/POST gets 405 and a JSON
    error, as Triton answers."""

    async def logging_endpoint(request: Request) -> Response:
        try:
            update = await _update_of(request, "logging")
            settings = await core.log_settings(update)
        except InferError as e:
            return _error(e)
        return _json(json_dumps(msgspec.structs.asdict(settings)))

    async def trace_endpoint(request: Request) -> Response:
        try:
            update = await _update_of(request, "trace")
            settings = await core.trace_settings(
                request.path_params.get("model_name", ""), update)
        except InferError as e:
            return _error(e)
        return _json(json_dumps(settings))

    def allow(endpoint):
        async def handle(request: Request) -> Response:
            if request.method not in ("GET", "POST"):
                return _json(encode_error("Method Not Allowed"), 405)
            return await endpoint(request)
        return handle

    return [Route("/v2/logging", allow(logging_endpoint), methods=_ANY_METHOD),
            Route("/v2/trace/setting", allow(trace_endpoint), methods=_ANY_METHOD),
            Route("/v2/models/{model_name}/trace/setting", allow(trace_endpoint),
                  methods=_ANY_METHOD)]


async def _update_of(request: Request, what: str) -> dict | None:
    if request.method == "GET":
        return None
    return parse_settings_body(await request.body(), what)


# -- gRPC -------------------------------------------------------------------------------

def grpc_method_handlers(core: DataPlane) -> dict[str, grpc.RpcMethodHandler]:
    rpcs = _Rpcs(core)

    def unary(fn, request_type):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString())

    return {"LogSettings": unary(rpcs.log_settings, service_pb2.LogSettingsRequest),
            "TraceSetting": unary(rpcs.trace_setting, service_pb2.TraceSettingRequest)}


def log_update_of(request) -> dict | None:
    """LogSettingsRequest -> the update (None: no settings, a read). A SettingValue
    with no field set is None, which changes nothing."""
    if not request.settings:
        return None
    update = {}
    for name, value in request.settings.items():
        which = value.WhichOneof("parameter_choice")
        update[name] = getattr(value, which) if which else None
    return update


def trace_update_of(request) -> dict | None:
    """TraceSettingRequest -> the update (None: a read). Every value is a list of
    strings; an empty one clears the setting, as Triton reads it."""
    if not request.settings:
        return None
    return {name: list(value.value) for name, value in request.settings.items()}


class _Rpcs:
    def __init__(self, core: DataPlane):
        self.core = core

    async def log_settings(self, request, context):
        try:
            s = await self.core.log_settings(log_update_of(request))
        except InferError as e:
            await context.abort(grpc_status(e.code), e.message)
        response = service_pb2.LogSettingsResponse()
        out = response.settings
        out["log_file"].string_param = s.log_file
        out["log_info"].bool_param = s.log_info
        out["log_warning"].bool_param = s.log_warning
        out["log_error"].bool_param = s.log_error
        out["log_verbose_level"].uint32_param = s.log_verbose_level
        out["log_format"].string_param = s.log_format
        return response

    async def trace_setting(self, request, context):
        try:
            settings = await self.core.trace_settings(request.model_name,
                                                      trace_update_of(request))
        except InferError as e:
            await context.abort(grpc_status(e.code), e.message)
        response = service_pb2.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list)
                                                 else [value])
        return response
