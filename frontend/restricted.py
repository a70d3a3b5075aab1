"""Restricted API groups (`--http-restricted-api`, `--grpc-restricted-protocol`) and the
HTTP input size limit (`--http-max-input-size`), as tritonserver defines them.

Every HTTP route and gRPC method belongs to one of Triton's API groups; the two tables
below say which, keyed by HTTP path pattern and by gRPC method name, so a route added
in another module (the repository API, say) is covered here without touching its code.
A request to a restricted group must carry the group's header with the exact value:

- HTTP: header `<key>` (names are case-insensitive, values exact); else 403 and
  `{"error": "This API is restricted, expecting header '<key>'"}`;
- gRPC: metadata `triton-grpc-protocol-<key>`; else UNAVAILABLE and
  "This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'".

The check runs before routing, parsing or reading the body (an ASGI wrapper and a
gRPC server interceptor), and neither is installed when nothing is restricted, so an
unrestricted server pays nothing per request.
"""

from __future__ import annotations

import re

import grpc

# Triton's RESTRICTED_CATEGORY_NAMES, in its order (scheduler/cli.py parses the flags
# with the same names; a unit test keeps the two equal)
GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config",
          "model-repository", "statistics", "trace", "logging")

# HTTP path patterns, first match wins (so "/v2/models/stats" is statistics, not the
# metadata of a model named "stats", as in Triton's router).
_M = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
HTTP_ROUTES: tuple[tuple[str, str], ...] = (
    (r"/v2/health/(?:live|ready)", "health"),
    (r"/v2/models/stats", "statistics"),
    (_M + r"/(?:infer|generate|generate_stream|infer_stream)", "inference"),
    (_M + r"/ready", "health"),
    (_M + r"/config", "model-config"),
    (_M + r"/stats", "statistics"),
    (_M + r"/trace/setting", "trace"),
    (_M, "metadata"),
    (r"/v2/?", "metadata"),
    (r"/v2/trace/setting", "trace"),
    (r"/v2/logging", "logging"),
    (r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "shared-memory"),
    (r"/v2/repository(?:/.*)?", "model-repository"),
)

# gRPC methods by name: GRPCInferenceService's methods, and the standard health
# service (Triton puts grpc.health.v1.Health under "health" too).
GRPC_METHODS: dict[str, str] = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "grpc.health.v1.Health/Check": "health", "grpc.health.v1.Health/Watch": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
}

_INFERENCE_SERVICE = "/inference.GRPCInferenceService/"

# Restrictions: {group: (header, value)}; the header is the full name a request
# must carry (for gRPC with the prefix, lower-case as gRPC metadata keys are). The
# scheduler parses the flags (scheduler/cli.py) and hands them to every frontend.
Restrictions = dict[str, tuple[str, str]]


# ----------------------------------------------------------------------------- HTTP

_HTTP_TABLE = tuple((re.compile(pattern), group) for pattern, group in HTTP_ROUTES)


def http_group(path: str) -> str | None:
    """The API group of an HTTP path; None for a path no group holds (Triton does not
    restrict what it does not route, e.g. a 404)."""
    for pattern, group in _HTTP_TABLE:
        if pattern.fullmatch(path):
            return group
    return None


def http_refusal(scope, restrictions: Restrictions) -> tuple[str, str] | None:
    """(group, message) when the request in `scope` lacks its group's header or value."""
    return path_refusal(scope["path"], scope["headers"], restrictions)


def path_refusal(path: str, headers, restrictions: Restrictions) -> tuple[str, str] | None:
    """http_refusal of a request to `path` with [(lowercase name, value)] `headers`."""
    group = http_group(path)
    restriction = restrictions.get(group) if group else None
    if restriction is None:
        return None
    header, expected = restriction
    name = header.lower().encode("latin-1")
    want = expected.encode("latin-1", "replace")
    for key, value in headers:
        if key == name:
            if value == want:
                return None
            break  # Triton looks at the first header of that name only
    return group, f"This API is restricted, expecting header '{header}'"


# ----------------------------------------------------------------------------- gRPC

def grpc_method_name(full: str) -> str:
    """'/inference.GRPCInferenceService/ModelInfer' -> 'ModelInfer'; other services
    keep their service: '/grpc.health.v1.Health/Check' -> 'grpc.health.v1.Health/Check'."""
    if full.startswith(_INFERENCE_SERVICE):
        return full[len(_INFERENCE_SERVICE):]
    return full.lstrip("/")


class RestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Refuses an RPC of a restricted group that lacks its metadata, before the
    request message is even deserialized (the refusing handler takes raw bytes)."""

    def __init__(self, restrictions: Restrictions):
        self.restrictions = restrictions

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        refusal = grpc_refusal(details.method, details.invocation_metadata,
                               self.restrictions)
        return handler if refusal is None else _refusing_handler(handler, refusal)


def grpc_refusal(method: str, metadata, restrictions: Restrictions) -> str | None:
    """The UNAVAILABLE message for an RPC of `method` ("/service/Method") whose
    `metadata` ((key, value) pairs) lacks its group's key or value; None if allowed.
    Both gRPC transports (grpcio's interceptor, the native server) ask this."""
    group = GRPC_METHODS.get(grpc_method_name(method))
    restriction = restrictions.get(group) if group else None
    if restriction is None:
        return None
    header, expected = restriction
    for key, value in metadata or ():
        if key == header:
            if value == expected:
                return None
            break  # the first of that name only, as Triton
    return f"This protocol is restricted, expecting header '{header}'"


def _refusing_handler(handler: grpc.RpcMethodHandler, message: str):
    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def refuse_stream(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield b""  # never reached; makes this an async generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)


# ------------------------------------------------------------------- HTTP input size

HTTP_DEFAULT_MAX_INPUT_SIZE = 1 << 26  # Triton's HTTP_DEFAULT_MAX_INPUT_SIZE, 64 MiB

_LIMIT_HINT = "Use --http-max-input-size to increase the limit."


def input_size_message(body_bytes: int, limit: int, header_length: str | None) -> str:
    """Triton's words for a request over --http-max-input-size, by the request's kind:
    a raw binary body (Inference-Header-Content-Length: 0), a JSON-only body, or a JSON
    header followed by binary tensors (Triton limits only the header there; this server
    limits the whole body, so one refusal covers a body no header could describe)."""
    if header_length is not None and header_length.strip() == "0":
        return (f"Raw input has a byte_size ({body_bytes} bytes) that exceeds the maximum "
                f"allowed value of {limit} bytes. {_LIMIT_HINT}")
    json_bytes = body_bytes
    if header_length is not None:
        try:
            json_bytes = int(header_length)
        except ValueError:
            json_bytes = body_bytes
    if header_length is None or json_bytes > limit:
        return (f"request JSON size of {json_bytes} bytes exceeds the maximum allowed "
                f"input size of {limit} bytes. {_LIMIT_HINT}")
    return (f"request size of {body_bytes} bytes exceeds the maximum allowed input size "
            f"of {limit} bytes. {_LIMIT_HINT}")
