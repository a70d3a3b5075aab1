"""The fallback engines a user may still choose: grpc.aio for gRPC (`--grpc-frontend
grpcio`) and uvicorn for HTTP (`--http-frontend uvicorn`). Each serves the same gRPC
handler table or HTTP app as the native engine of its protocol, and is started and
stopped the same way (`start()`, `stop(grace)`); engines.py picks one.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..grpc_tls import TlsSettings, grpcio_credentials
from ..restricted import RestrictionInterceptor, Restrictions
from .grpc_native import MAX_MESSAGE_BYTES
from .h2_keepalive import KeepaliveSettings


def server_options(keepalive: KeepaliveSettings | None = None,
                   tls_handshake_timeout: float | None = None) -> list[tuple[str, int]]:
    """grpc.aio's channel arguments: shared port, Triton's message size limits, the
    keepalive flags as Triton passes them, the TLS handshake's deadline."""
    opts = [
        ("grpc.so_reuseport", 1),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if keepalive is not None:
        opts += keepalive.grpcio_options()
    if tls_handshake_timeout is not None:
        opts.append(("grpc.server_handshake_timeout_ms", int(tls_handshake_timeout * 1000)))
    return opts


class GrpcioServer:
    """grpc.aio serving `table` ({service: {method: handler}}) on `address`
    ("host:port"; port 0: the kernel picks, `bound_port` says which). Made with the
    event loop it will run on set (grpc.aio's rule)."""

    def __init__(self, table: dict, address: str, restrictions: Restrictions | None,
                 keepalive: KeepaliveSettings | None, tls: TlsSettings | None,
                 tls_handshake_timeout: float):
        import grpc

        # no interceptor at all when nothing is restricted: it would cost every RPC
        interceptors = [RestrictionInterceptor(restrictions)] if restrictions else None
        self.server = grpc.aio.server(options=server_options(
                                          keepalive, tls_handshake_timeout if tls else None),
                                      interceptors=interceptors)
        for service, handlers in table.items():
            if hasattr(self.server, "add_registered_method_handlers"):  # grpcio >= 1.63
                self.server.add_registered_method_handlers(service, handlers)
            self.server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, handlers),))
        if tls is not None:
            port = self.server.add_secure_port(address, grpcio_credentials(tls))
        else:
            port = self.server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"gRPC server could not bind {address}")
        self.bound_port = port

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace: float | None = None) -> None:
        await self.server.stop(grace)


class UvicornServer:
    """uvicorn serving the ASGI `app` on the listening socket `sock`."""

    def __init__(self, app, sock):
        import uvicorn

        class _Server(uvicorn.Server):
            # signals belong to the frontend process's own handlers (main.py)
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(app, lifespan="off", http="httptools", loop="none",
                                access_log=False,
                                # log_config None: uvicorn's records go through this
                                # process's handler (the shared --log-file)
                                log_config=None,
                                log_level="warning", timeout_keep_alive=300,
                                # per-request work nobody asked for: proxy header
                                # rewriting and a formatted Date/Server header
                                proxy_headers=False, date_header=False,
                                server_header=False)
        self.server = _Server(config)
        self.sock = sock
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self.server.serve(sockets=[self.sock]))

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; requests in flight get `grace` seconds."""
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.task, grace)
