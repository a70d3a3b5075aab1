"""The frontend processes: spawning them on the shared ports, restarting one that dies,
and draining them at shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable

import msgspec

from scheduler.supervisor import Child, describe_exit
from scheduler.worker_pool import RestartPolicy
from shm.arena import remove_segments
from shm.channel import Outbox, ipc_address
from shm.messages.frontend import Drain, FrontendReady, FrontendStopped
from shm.messages.results import PeerGone

log = logging.getLogger("shmserve.scheduler")


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
                 on_ready: Callable[[FrontendHandle], None]):
        self.args = args
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
        a = self.args
        fe.child = Child(f"frontend {index}", "frontend.main", [
            "--index", str(index), "--address", address,
            "--scheduler", self.scheduler_address,
            "--segment-prefix", fe.prefix, "--arena-bytes", str(a.arena_mib << 20),
            "--http-address", a.http_address, "--http-port", str(a.http_port),
            "--grpc-address", a.grpc_address, "--grpc-port", str(a.grpc_port),
            "--allow-http", str(a.allow_http).lower(), "--allow-grpc", str(a.allow_grpc).lower(),
            "--log-settings", msgspec.json.encode(a.log_settings).decode(),
            "--server-id", a.server_id,
        ], on_exit=self._on_exit)
        self.frontends[index] = fe
        fe.child.start(asyncio.get_running_loop())
        await asyncio.wait_for(fe.ready, a.startup_timeout_secs)
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
        """Stop taking requests, finish those in flight, exit."""
        self.stopping = True
        self.broadcast(Drain(timeout))
        children = [fe.child for fe in self.frontends.values() if fe.child is not None]
        await asyncio.gather(*(c.wait(timeout + 5.0) for c in children))
        await asyncio.gather(*(c.stop(2.0) for c in children))
