"""A frontend process: the HTTP and gRPC servers over one SchedulerDataPlane.

Several of these run at once; each binds the same ports with SO_REUSEPORT and the
kernel spreads connections across them, so protocol parsing scales with cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys

import msgspec

from frontend.dataplane import SchedulerDataPlane
from frontend.grpc_tls import TlsSettings
from frontend.transport.h2_keepalive import KeepaliveSettings
from frontend.transport.sockets import reuseport_socket
from shm.lifecycle import die_with_parent, keep_freed_heap, run_loop, watch_parent
from shm.log import configure_logging
from shm.messages.frontend import FrontendReady, FrontendStopped
from shm.messages.settings import LogSettings

log = logging.getLogger("shmserve.frontend")


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes", "on")


def _restrictions(text: str) -> dict[str, tuple[str, str]]:
    return {group: (key, value) for group, (key, value) in msgspec.json.decode(text).items()}


# Triton's gRPC keepalive and age flags (--grpc-FLAG) -> KeepaliveSettings fields
KEEPALIVE_FLAGS = {
    "keepalive-time": "keepalive_time_ms", "keepalive-timeout": "keepalive_timeout_ms",
    "keepalive-permit-without-calls": "keepalive_permit_without_calls",
    "http2-max-pings-without-data": "http2_max_pings_without_data",
    "http2-min-recv-ping-interval-without-data":
        "http2_min_recv_ping_interval_without_data_ms",
    "http2-max-ping-strikes": "http2_max_ping_strikes",
    "max-connection-age": "max_connection_age_ms",
    "max-connection-age-grace": "max_connection_age_grace_ms",
}


def keepalive_settings(args) -> KeepaliveSettings:
    return KeepaliveSettings(**{field: getattr(args, "grpc_" + flag.replace("-", "_"))
                                for flag, field in KEEPALIVE_FLAGS.items()})


def tls_settings(args) -> TlsSettings | None:
    if not (args.grpc_use_ssl or args.grpc_use_ssl_mutual):
        return None
    return TlsSettings(args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert,
                       mutual=args.grpc_use_ssl_mutual)


async def serve(args) -> int:
    loop = asyncio.get_running_loop()
    core = SchedulerDataPlane(args.address, args.scheduler, args.segment_prefix,
                              args.arena_bytes, role=args.role,
                              arena_high_water=args.arena_high_water)
    core.attach(loop)

    def on_term():
        core.on_drain_signal()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # the scheduler coordinates

    http_server = http_task = grpc_server = native_http = None
    from frontend import EXTENSIONS, VERSION
    if args.allow_http:
        from frontend.http_server import make_http_app
        http_sock = reuseport_socket(args.http_address, args.http_port)
        http_app = make_http_app(core, server_name=args.server_id, server_version=VERSION,
                                 extensions=EXTENSIONS,
                                 header_forward=args.http_header_forward_pattern,
                                 restrictions=_restrictions(args.http_restricted_api),
                                 max_input_size=args.http_max_input_size)
    if args.allow_http and args.http_frontend == "uvicorn":
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
    if args.allow_grpc:
        from frontend.grpc_server import make_grpc_server
        grpc_server = make_grpc_server(core, f"{args.grpc_address}:{args.grpc_port}",
                                       server_name=args.server_id,
                                       server_version=VERSION, extensions=EXTENSIONS,
                                       header_forward=args.grpc_header_forward_pattern,
                                       restrictions=_restrictions(
                                           args.grpc_restricted_protocol),
                                       frontend=args.grpc_frontend,
                                       keepalive=keepalive_settings(args),
                                       tls=tls_settings(args))

    core.outbox.send(args.scheduler, FrontendReady(args.index, args.address, os.getpid()))
    await core.got_state.wait()
    if grpc_server is not None:
        await grpc_server.start()
    if http_server is not None:
        http_task = loop.create_task(http_server.serve(sockets=[http_sock]))
    elif args.allow_http:
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
    core.outbox.send(args.scheduler, FrontendStopped(args.index, abandoned))
    core.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line the scheduler's frontend pool gives this process."""
    p = argparse.ArgumentParser(prog="shmserve-frontend")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--scheduler", required=True)
    p.add_argument("--segment-prefix", required=True)
    p.add_argument("--arena-bytes", type=int, default=64 << 20)
    p.add_argument("--arena-high-water", type=int, default=None,
                   help="bytes of free arena segments kept for reuse (default: 4 chunks)")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--allow-http", type=_bool, default=True)
    p.add_argument("--allow-grpc", type=_bool, default=True)
    p.add_argument("--log-settings", default="{}", help="LogSettings as JSON")
    p.add_argument("--http-header-forward-pattern", default="")
    p.add_argument("--grpc-header-forward-pattern", default="")
    p.add_argument("--server-id", default="shmserve", help="the server metadata's name")
    p.add_argument("--http-restricted-api", default="{}",
                   help="JSON {group: [header, value]}, parsed by the scheduler")
    p.add_argument("--grpc-restricted-protocol", default="{}",
                   help="JSON {group: [metadata key, value]}, parsed by the scheduler")
    p.add_argument("--http-max-input-size", type=int, default=1 << 26)
    p.add_argument("--grpc-frontend", choices=("native", "grpcio"), default="native")
    p.add_argument("--http-frontend", choices=("native", "uvicorn"), default="native")
    # Triton's gRPC keepalive, age and TLS flags, checked by the scheduler's CLI
    for flag, field in KEEPALIVE_FLAGS.items():
        default = getattr(KeepaliveSettings, field)
        p.add_argument(f"--grpc-{flag}", type=_bool if isinstance(default, bool) else int,
                       default=default)
    for flag in ("use-ssl", "use-ssl-mutual"):
        p.add_argument(f"--grpc-{flag}", type=_bool, default=False)
    for flag in ("server-cert", "server-key", "root-cert"):
        p.add_argument(f"--grpc-{flag}", default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.role = f"frontend[{args.index}]"
    configure_logging(args.role, msgspec.json.decode(args.log_settings, type=LogSettings))
    die_with_parent(signal.SIGTERM)
    watch_parent(args.segment_prefix, args.address)
    keep_freed_heap()  # large bodies and responses reuse pages, not fault them in again
    sys.exit(run_loop(serve(args)))


if __name__ == "__main__":
    from shm.lifecycle import run_main
    run_main(main, "frontend")
