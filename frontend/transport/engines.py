"""One constructor per protocol for the engine that serves what the frontend built
over its data plane: `grpc_engine` for the gRPC handler table, `http_engine` for the
HTTP app. Each gives the native engine (grpc_native, http1) or its fallback
(fallbacks.py), bound and not yet started, with `start()` and `stop(grace)`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..grpc_tls import HANDSHAKE_TIMEOUT, TlsSettings
from ..restricted import Restrictions
from ..types import DataPlane
from .h2_keepalive import KeepaliveSettings
from .sockets import reuseport_socket


class GrpcService(NamedTuple):
    """The gRPC handler table, with what the native engine is told of its methods."""

    table: dict  # {service: {method: grpc.RpcMethodHandler}}
    # unary methods whose large messages are received straight into arena blocks
    arena_paths: tuple[str, ...] = ()
    # "/service/Method" -> check(prefix): whether a message beginning so is malformed
    # whatever follows (a compressed one stops inflating then)
    message_checks: dict[str, Callable] = {}
    # "/service/Method" -> start(message, context, done): unary methods the native
    # engine serves without a task (NativeGrpcServer.starters); grpcio's awaits the
    # handler in the table as before
    starters: dict[str, Callable] = {}


def grpc_engine(kind: str, service: GrpcService, address: str, core: DataPlane, *,
                restrictions: Restrictions | None = None,
                keepalive: KeepaliveSettings | None = KeepaliveSettings(),
                tls: TlsSettings | None = None,
                tls_handshake_timeout: float = HANDSHAKE_TIMEOUT):
    """`service` on `address` ("host:port"; port 0: the kernel picks, `bound_port`
    says which): transport.grpc_native's engine (`kind` "native") or grpc.aio's
    ("grpcio"). `restrictions` ({group: (metadata key, value)}) are checked on every
    method; `keepalive` (Triton's defaults unless given) and `tls` (None: cleartext)
    are Triton's gRPC flags; a TLS handshake not done within `tls_handshake_timeout`
    seconds is dropped. Made with the event loop it will run on set."""
    if kind == "native":
        from .grpc_native import NativeGrpcServer
        from ..grpc_tls import server_context
        host, _, port = address.rpartition(":")
        return NativeGrpcServer(
            {f"/{name}/{method}": handler for name, methods in service.table.items()
             for method, handler in methods.items()},
            reuseport_socket(host.strip("[]"), int(port)), restrictions,
            body_buffer=core.body_buffer,
            # the message and its 5-byte prefix in one block
            arena_body_max=core.body_block_max - 5,
            free_blocks=core.free_blocks, body_quota=core.body_quota,
            arena_paths=service.arena_paths, message_checks=service.message_checks,
            starters=service.starters,
            keepalive=keepalive, ssl_context=server_context(tls) if tls else None,
            tls_handshake_timeout=tls_handshake_timeout)
    if kind == "grpcio":
        from .fallbacks import GrpcioServer
        return GrpcioServer(service.table, address, restrictions, keepalive, tls,
                            tls_handshake_timeout)
    raise ValueError(f"unknown gRPC frontend {kind!r}")


def http_engine(kind: str, app, address: str, port: int):
    """The HTTP `app` on `address`:`port`: transport.http1's engine (`kind` "native")
    or uvicorn's ("uvicorn")."""
    if kind == "native":
        from .http1 import NativeHttpServer as engine
    elif kind == "uvicorn":
        from .fallbacks import UvicornServer as engine
    else:
        raise ValueError(f"unknown HTTP frontend {kind!r}")
    return engine(app, reuseport_socket(address, port))
