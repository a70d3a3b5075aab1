"""The standard gRPC health service, `grpc.health.v1.Health`, for Kubernetes gRPC
probes and load balancers.

As Triton: Check answers SERVING while the server is ready (`/v2/health/ready`, so
with --strict-readiness every model must be ready) and NOT_SERVING otherwise, for
any `service` name (Triton does not look at it). Watch streams the status, first at
once and then each time it changes, and ends with NOT_SERVING when the server stops.

The two messages are one field each, so they are written and read by hand here
rather than through a generated module (grpcio-health-checking is not a dependency).
"""

from __future__ import annotations

import asyncio

import grpc

from .types import DataPlane

SERVICE = "grpc.health.v1.Health"

# grpc.health.v1.HealthCheckResponse.ServingStatus
SERVING = 1
NOT_SERVING = 2

WATCH_POLL_S = 0.5  # how often Watch looks at readiness (it has no change event)


def encode_response(status: int) -> bytes:
    """HealthCheckResponse{status}: field 1, varint (every status fits in one byte)."""
    return bytes((0x08, status))


def decode_response(data: bytes) -> int:
    """The status of a HealthCheckResponse (for tests and clients); 0 when absent."""
    i, status = 0, 0
    while i < len(data):
        tag = data[i]
        i += 1
        if tag == 0x08:
            status, i = _varint(data, i)
        elif tag & 7 == 2:  # length-delimited: skip
            n, i = _varint(data, i)
            i += n
        elif tag & 7 == 0:
            _, i = _varint(data, i)
        else:
            raise ValueError(f"unexpected wire type in tag {tag:#x}")
    return status


def encode_request(service: str = "") -> bytes:
    raw = service.encode()
    return (b"\x0a" + _encode_varint(len(raw)) + raw) if raw else b""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


class HealthServicer:
    def __init__(self, core: DataPlane):
        self.core = core

    def status(self) -> int:
        return SERVING if self.core.server_ready() else NOT_SERVING

    async def check(self, request: bytes, context) -> bytes:
        return encode_response(self.status())

    async def watch(self, request: bytes, context):
        last = None
        while True:
            stopping = self.core.stopping
            status = NOT_SERVING if stopping else self.status()
            if status != last:
                yield encode_response(status)
                last = status
            if stopping:
                return  # the stream must not hold up a drain
            await asyncio.sleep(WATCH_POLL_S)

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "Check": grpc.unary_unary_rpc_method_handler(
                self.check, request_deserializer=None, response_serializer=None),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=None, response_serializer=None),
        }


def register(server: grpc.aio.Server, core: DataPlane) -> None:
    handlers = HealthServicer(core).method_handlers()
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(SERVICE, handlers)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
