"""The frontend processes: spawning them on the shared ports, restarting one that dies,
and draining them at shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Callable

from scheduler.processes.supervisor import Child, describe_exit
from scheduler.processes.worker_pool import RestartPolicy, child_fields
from shm.arena import remove_segments
from shm.channel import Outbox, ipc_address
from shm.messages.frontend import Drain, FrontendReady, FrontendStopped
from shm.messages.results import PeerGone
from shm.messages.roles import FrontendSpec, GrpcKeepalive, TlsSettings

log = logging.getLogger("shmserve.scheduler")


class PortInUse(Exception):
    """A port this server would listen on is taken; the text names it."""


def claim_port(flag: str, address: str, port: int) -> socket.socket:
    """Make sure no other server listens on `port`, and keep it that way.

    The frontends share their ports with SO_REUSEPORT, which would also let a second
    shmserve of the same user join the port and take half the connections. So
    before anything listens: (1) the port's lock, an abstract Unix socket named after
    it, is bound; the kernel lets one process hold a name, drops it when that process
    dies, and it lives in the same network namespace as the port, so of two servers
    started at once exactly one gets it; (2) the port itself is bound once without
    SO_REUSEPORT, which fails while anything at all listens there (another program, an
    older server). The lock is returned and held until the server stops."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0shmserve-port-{port}")
    except OSError:
        lock.close()
        raise PortInUse(f"port {port} ({flag}) is already in use by another shmserve "
                        "server; stop it or choose another port") from None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR: a connection of an earlier server in TIME_WAIT is no conflict,
        # a listening socket still is
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((address, port))
    except OSError as exc:
        lock.close()
        raise PortInUse(f"port {port} ({flag}) on {address} is already in use: "
                        f"{exc.strerror or exc}") from None
    finally:
        probe.close()
    return lock


def grpc_keepalive(args) -> GrpcKeepalive:
    """Triton's gRPC keepalive, PING abuse and age flags, as the frontends take them."""
    return GrpcKeepalive(
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=(
            args.grpc_http2_min_recv_ping_interval_without_data),
        http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_connection_age_ms=args.grpc_max_connection_age,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace)


def grpc_tls(args) -> TlsSettings | None:
    """Triton's gRPC TLS flags (checked by the CLI); None: plain gRPC."""
    if not (args.grpc_use_ssl or args.grpc_use_ssl_mutual):
        return None
    return TlsSettings(args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert,
                       mutual=args.grpc_use_ssl_mutual)


def frontend_spec(args, index: int, address: str, prefix: str,
                  scheduler_address: str) -> FrontendSpec:
    """What frontend `index` is told at its start, from the server's flags."""
    return FrontendSpec(
        index=index, address=address, scheduler=scheduler_address, segment_prefix=prefix,
        http_address=args.http_address, http_port=args.http_port,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port,
        allow_http=args.allow_http, allow_grpc=args.allow_grpc,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        server_id=args.server_id, http_restricted_api=args.http_restricted_api,
        grpc_restricted_protocol=args.grpc_restricted_protocol,
        http_max_input_size=args.http_max_input_size,
        grpc_frontend=args.grpc_frontend, http_frontend=args.http_frontend,
        grpc_keepalive=grpc_keepalive(args), grpc_tls=grpc_tls(args),
        **child_fields(args))


class FrontendHandle:
    def __init__(self, index: int, address: str, prefix: str):
        self.index = index
        self.address = address
        self.prefix = prefix
        self.child: Child | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stopped = False


class FrontendPool:
    def __init__(self, args, run_dir: str, shm_prefix: str, scheduler_address: str,
                 outbox: Outbox, restarts: RestartPolicy,
                 on_gone: Callable[[PeerGone], None],
                 on_ready: Callable[[FrontendHandle], None],
                 launcher: Callable[..., Child] = Child):
        self.args = args
        self.launcher = launcher  # Child, or a test's in-process fake
        self.run_dir = run_dir
        self.shm_prefix = shm_prefix
        self.scheduler_address = scheduler_address
        self.outbox = outbox
        self.restarts = restarts
        self._on_gone = on_gone  # tell the workers a frontend's inbox and arena are gone
        self._on_ready = on_ready  # send a new frontend the model table
        self.frontends: dict[int, FrontendHandle] = {}
        self.stopping = False
        self._gen = itertools.count(1)
        self._port_locks: list[socket.socket] = []

    def claim_ports(self) -> None:
        """Fail at once (PortInUse) if a port of this server is taken; see claim_port.
        The metrics port is checked too: it is bound exclusively later, and a clash
        there should fail before the models load, not after."""
        a = self.args
        wanted = []
        if a.allow_http:
            wanted.append(("--http-port", a.http_address, a.http_port))
        if a.allow_grpc:
            wanted.append(("--grpc-port", a.grpc_address, a.grpc_port))
        if a.allow_metrics:
            wanted.append(("--metrics-port", a.metrics_address, a.metrics_port))
        seen = set()
        try:
            for flag, address, port in wanted:
                if port == 0:  # the kernel picks one: nothing to clash with
                    continue
                if port in seen:
                    raise PortInUse(f"port {port} ({flag}) is given to two services")
                seen.add(port)
                self._port_locks.append(claim_port(flag, address, port))
        except PortInUse:
            self.release_ports()
            raise

    def release_ports(self) -> None:
        for lock in self._port_locks:
            lock.close()
        self._port_locks.clear()

    def addresses(self) -> list[str]:
        return [fe.address for fe in self.frontends.values()]

    def broadcast(self, msg) -> None:
        for fe in self.frontends.values():
            self.outbox.send(fe.address, msg)

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn(i) for i in range(self.args.frontend_processes)))

    async def _spawn(self, index: int) -> FrontendHandle:
        gen = next(self._gen)
        address = ipc_address(self.run_dir, f"f{index}g{gen}")
        fe = FrontendHandle(index, address, f"{self.shm_prefix}f{index}g{gen}")
        spec = frontend_spec(self.args, index, address, fe.prefix, self.scheduler_address)
        fe.child = self.launcher(f"frontend {index}", "frontend.main", spec.to_argv(),
                                 on_exit=self._on_exit)
        self.frontends[index] = fe
        fe.child.start(asyncio.get_running_loop())
        await asyncio.wait_for(fe.ready, self.args.startup_timeout_secs)
        return fe

    def on_frontend_ready(self, msg: FrontendReady) -> None:
        fe = self.frontends.get(msg.index)
        if fe is None or fe.address != msg.address:
            return
        self._on_ready(fe)
        if not fe.ready.done():
            fe.ready.set_result(True)

    def on_frontend_stopped(self, msg: FrontendStopped) -> None:
        fe = self.frontends.get(msg.index)
        if fe is not None:
            fe.stopped = True
            if msg.abandoned:
                log.warning("frontend %d stopped with %d request(s) still in flight",
                            msg.index, msg.abandoned)

    def _on_exit(self, child: Child, returncode: int) -> None:
        fe = next((f for f in self.frontends.values() if f.child is child), None)
        if fe is None:
            return
        remove_segments(fe.prefix + "-")
        self.outbox.drop(fe.address)
        self._on_gone(PeerGone(fe.address, fe.prefix + "-"))
        if not fe.ready.done():
            fe.ready.set_exception(RuntimeError(
                f"frontend {fe.index} {describe_exit(returncode)} while starting "
                "(is a port in use?)"))
            return
        if self.stopping:
            return
        log.error("frontend %d %s; restarting it", fe.index, describe_exit(returncode))
        if self.restarts.allow(f"frontend{fe.index}"):
            asyncio.get_running_loop().create_task(self._spawn(fe.index))

    async def drain(self, timeout: float) -> None:
        """Stop taking requests, finish those in flight, exit: within `timeout` and
        a margin, whatever their clients do. A frontend ends itself a second after
        the timeout (frontend/main.py); one still here after two is killed (it
        ignores SIGTERM while it drains), so it never holds the ports past the stop."""
        self.stopping = True
        self.broadcast(Drain(timeout))
        children = [fe.child for fe in self.frontends.values() if fe.child is not None]
        await asyncio.gather(*(c.wait(timeout + 2.0) for c in children))
        await asyncio.gather(*(c.stop(0.5) for c in children))
        self.release_ports()
