"""A frontend process: the HTTP and gRPC servers over one SchedulerDataPlane.

Several of these run at once; each binds the same ports with SO_REUSEPORT and the
kernel spreads connections across them, so protocol parsing scales with cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

import msgspec

from frontend.dataplane import SchedulerDataPlane
from frontend.transport.h2_keepalive import KeepaliveSettings
from frontend.transport.sockets import reuseport_socket
from shm.lifecycle import die_with_parent, keep_freed_heap, run_loop, watch_parent
from shm.log import configure_logging
from shm.messages.frontend import FrontendReady, FrontendStopped
from shm.messages.roles import FrontendSpec

log = logging.getLogger("shmserve.frontend")


def keepalive_settings(spec: FrontendSpec) -> KeepaliveSettings:
    return KeepaliveSettings(*msgspec.structs.astuple(spec.grpc_keepalive))


async def serve(spec: FrontendSpec) -> int:
    loop = asyncio.get_running_loop()
    core = SchedulerDataPlane(spec.address, spec.scheduler, spec.segment_prefix,
                              spec.arena_bytes, role=role_of(spec),
                              arena_high_water=spec.arena_high_water)
    core.attach(loop)

    def on_term():
        core.on_drain_signal()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # the scheduler coordinates

    http_server = http_task = grpc_server = native_http = None
    from frontend import EXTENSIONS, VERSION
    if spec.allow_http:
        from frontend.http_server import make_http_app
        http_sock = reuseport_socket(spec.http_address, spec.http_port)
        http_app = make_http_app(core, server_name=spec.server_id, server_version=VERSION,
                                 extensions=EXTENSIONS,
                                 header_forward=spec.http_header_forward_pattern,
                                 restrictions=spec.http_restricted_api,
                                 max_input_size=spec.http_max_input_size)
    if spec.allow_http and spec.http_frontend == "uvicorn":
        import uvicorn

        class _Server(uvicorn.Server):
            # signals belong to this process's own handlers above
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(http_app, lifespan="off",
                                http="httptools", loop="none", access_log=False,
                                # log_config None: uvicorn's records go through
                                # this process's handler (the shared --log-file)
                                log_config=None,
                                log_level="warning", timeout_keep_alive=300,
                                # per-request work nobody asked for: proxy header
                                # rewriting and a formatted Date/Server header
                                proxy_headers=False, date_header=False,
                                server_header=False)
        http_server = _Server(config)
    if spec.allow_grpc:
        from frontend.grpc_server import make_grpc_server
        grpc_server = make_grpc_server(core, f"{spec.grpc_address}:{spec.grpc_port}",
                                       server_name=spec.server_id,
                                       server_version=VERSION, extensions=EXTENSIONS,
                                       header_forward=spec.grpc_header_forward_pattern,
                                       restrictions=spec.grpc_restricted_protocol,
                                       frontend=spec.grpc_frontend,
                                       keepalive=keepalive_settings(spec),
                                       tls=spec.grpc_tls)

    core.outbox.send(spec.scheduler, FrontendReady(spec.index, spec.address, os.getpid()))
    await core.got_state.wait()
    if grpc_server is not None:
        await grpc_server.start()
    if http_server is not None:
        http_task = loop.create_task(http_server.serve(sockets=[http_sock]))
    elif spec.allow_http:
        from frontend.transport import http1
        native_http = await http1.serve(http_app, http_sock)

    timeout = await core.drain_requested
    # Draining: new requests are refused (core.stopping); wait for those in flight.
    try:
        await asyncio.wait_for(core.idle.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    abandoned = len(core.pending)
    core.fail_pending()
    if grpc_server is not None:
        await grpc_server.stop(grace=0.5)
    if http_server is not None:
        http_server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(http_task, 5.0)
    if native_http is not None:
        await native_http.stop(5.0)
    core.outbox.send(spec.scheduler, FrontendStopped(spec.index, abandoned))
    core.close()
    return 0


def role_of(spec: FrontendSpec) -> str:
    return f"frontend[{spec.index}]"


def main(argv: list[str] | None = None) -> None:
    spec = FrontendSpec.from_argv(sys.argv[1:] if argv is None else argv)
    configure_logging(role_of(spec), spec.log_settings)
    die_with_parent(signal.SIGTERM)
    watch_parent(spec.segment_prefix, spec.address)
    keep_freed_heap()  # large bodies and responses reuse pages, not fault them in again
    sys.exit(run_loop(serve(spec)))


if __name__ == "__main__":
    from shm.lifecycle import run_main
    run_main(main, "frontend")
