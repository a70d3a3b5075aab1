"""A frontend process: the HTTP and gRPC servers over one SchedulerDataPlane.

Several of these run at once; each binds the same ports with SO_REUSEPORT and the
kernel spreads connections across them, so protocol parsing scales with cores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import msgspec

from frontend.dataplane import SchedulerDataPlane
from frontend.transport.h2_keepalive import KeepaliveSettings
from shm.lifecycle import (die_with_parent, exit_when_overdue, keep_freed_heap, run_loop,
                           watch_parent)
from shm.log import configure_logging
from shm.messages.frontend import FrontendReady, FrontendStopped
from shm.messages.roles import FrontendSpec

log = logging.getLogger("shmserve.frontend")

# a stop ends by the exit timeout plus this, whatever its engines wait for; the
# scheduler kills a frontend still there a little later (FrontendPool.drain)
STOP_MARGIN_S = 1.0
MIN_GRACE_S = 0.25  # an engine's least time to write the failures and close


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

    # Each protocol the same way round: what it serves is built over the data plane
    # (the HTTP app, the gRPC handler table), then handed to its engine, native or
    # fallback (transport/engines.py), bound now and started once the model table came.
    from frontend import EXTENSIONS, VERSION
    from frontend.transport.engines import grpc_engine, http_engine
    engines = []  # (engine, seconds its calls in flight get at the stop)
    if spec.allow_grpc:
        from frontend.grpc_server import handler_table
        table = handler_table(core, server_name=spec.server_id, server_version=VERSION,
                              extensions=EXTENSIONS,
                              header_forward=spec.grpc_header_forward_pattern)
        engines.append((grpc_engine(spec.grpc_frontend, table,
                                    f"{spec.grpc_address}:{spec.grpc_port}", core,
                                    restrictions=spec.grpc_restricted_protocol,
                                    keepalive=keepalive_settings(spec),
                                    tls=spec.grpc_tls), 0.5))
    if spec.allow_http:
        from frontend.http_server import make_http_app
        app = make_http_app(core, server_name=spec.server_id, server_version=VERSION,
                            extensions=EXTENSIONS,
                            header_forward=spec.http_header_forward_pattern,
                            restrictions=spec.http_restricted_api,
                            max_input_size=spec.http_max_input_size)
        engines.append((http_engine(spec.http_frontend, app, spec.http_address,
                                    spec.http_port), 5.0))

    core.outbox.send(spec.scheduler, FrontendReady(spec.index, spec.address, os.getpid()))
    await core.got_state.wait()
    for engine, _ in engines:
        await engine.start()

    timeout = await core.drain_requested
    # The whole stop fits the exit timeout, whatever the clients do (a stream that
    # never ends, a peer that never reads): past it and a margin, a thread ends us.
    deadline = loop.time() + timeout
    overdue = exit_when_overdue(spec.segment_prefix, timeout + STOP_MARGIN_S,
                                role_of(spec))
    # Draining: new requests are refused (core.stopping); wait for those in flight.
    try:
        await asyncio.wait_for(core.idle.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    abandoned = len(core.pending)
    core.fail_pending()
    for engine, grace in engines:
        # what is left of the timeout, and at least a moment to send the failures
        await engine.stop(min(grace, max(deadline - loop.time(), MIN_GRACE_S)))
    core.outbox.send(spec.scheduler, FrontendStopped(spec.index, abandoned))
    core.close()
    overdue.cancel()
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
