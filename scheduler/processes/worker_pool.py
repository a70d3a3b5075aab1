"""The worker processes: spawning them, placing instances in them, noticing deaths.

A python instance gets a process of its own; framework instances (onnxruntime,
pytorch) share the one worker of their device ("cpu", "gpu:N"). What to do when a
worker dies (fail its requests, restart its instances) is the model manager's call:
the pool reports which instances were lost through `on_instances_lost`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from typing import Callable

import orjson

from scheduler.processes import exec_env
from scheduler.scheduling.rate_limiter import InstanceSlot
from scheduler.processes.supervisor import Child, describe_exit
from shm.arena import remove_segments
from shm.backends import DEVICE_WORKER_BACKENDS
from shm.channel import Outbox, ipc_address
from shm.devices import worker_device
from shm.messages.results import PeerGone
from shm.messages.roles import WorkerSpec
from shm.messages.worker import (InstanceLoaded, LoadInstance, StopWorker, UnloadInstance,
                                 WorkerReady)

log = logging.getLogger("shmserve.scheduler")

# A child that keeps dying is not restarted forever.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
# How often running batches are checked against their execute timeout.
WATCH_PERIOD_S = 0.1


def execute_timeout(config_json: bytes, backend_config: dict[str, str]) -> float:
    """A python instance's execute timeout in seconds, 0 for none (Triton's default:
    its python backend never times out an execute; its stub-timeout-seconds bounds
    only the stub's start and messages). Set per model with the config parameter
    `EXECUTE_TIMEOUT_SECS`, or for every python model with
    `--backend-config=python,execute-timeout-secs=N`; the model's own wins. An instance
    whose execute runs longer is killed (its requests fail) and restarted."""
    try:
        params = orjson.loads(config_json).get("parameters") or {}
        value = (params.get("EXECUTE_TIMEOUT_SECS") or {}).get("string_value")
    except (orjson.JSONDecodeError, AttributeError):
        value = None
    if value is None:
        value = backend_config.get("execute-timeout-secs")
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except ValueError:
        raise RuntimeError(f"execute timeout must be a number of seconds, got {value!r}")


def child_fields(args) -> dict:
    """The ChildSpec fields every child gets from the server's flags: its arena, and
    the log settings in force now (a child restarted later logs as the others do)."""
    mib = args.arena_high_water_mib
    return {"arena_bytes": args.arena_mib << 20,
            "arena_high_water": None if mib is None else mib << 20,
            "log_settings": args.log_settings}


class WorkerHandle:
    """A worker process and what the scheduler is waiting to hear from it."""

    def __init__(self, name: str, address: str, prefix: str, device: str = ""):
        self.name = name
        self.address = address
        self.prefix = prefix
        # "cpu" / "gpu:N" for the worker that framework instances of a device share;
        # "" for a python instance's own worker
        self.device = device
        self.child: Child | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.loads: dict[str, asyncio.Future] = {}
        self.slots: list[InstanceSlot] = []
        self.killed_for = ""  # why the pool killed it (a hung execute), if it did
        self.stop_sent = False  # told to stop: it exits soon and needs no more news


class RestartPolicy:
    """At most MAX_RESTARTS restarts of one child (by key) in RESTART_WINDOW_S."""

    def __init__(self):
        self._times: dict[str, list[float]] = {}
        self._forgiven: set[str] = set()

    def forgive(self, key: str) -> None:
        """The next restart of `key` does not count: its death was a client's doing
        (a shared-memory region truncated under it), and a client must not be able to
        disable a model for everyone by faulting it over and over."""
        self._forgiven.add(key)

    def allow(self, key: str) -> bool:
        if key in self._forgiven:
            self._forgiven.discard(key)
            return True
        now = time.monotonic()
        times = [t for t in self._times.get(key, []) if now - t < RESTART_WINDOW_S]
        times.append(now)
        self._times[key] = times
        return len(times) <= MAX_RESTARTS


class WorkerPool:
    def __init__(self, args, run_dir: str, shm_prefix: str, scheduler_address: str,
                 outbox: Outbox, peers: Callable[[], list[str]],
                 on_instances_lost: Callable[[list[InstanceSlot], str], None],
                 launcher: Callable[..., Child] = Child):
        self.args = args
        self.launcher = launcher  # Child, or a test's in-process fake
        self.run_dir = run_dir
        self.shm_prefix = shm_prefix
        self.scheduler_address = scheduler_address
        self.outbox = outbox
        self.loop = asyncio.get_running_loop()
        self._peers = peers  # the frontends' inboxes, told when a worker is gone
        self._on_instances_lost = on_instances_lost
        self.workers: dict[str, WorkerHandle] = {}  # by address
        self.worker_of: dict[str, WorkerHandle] = {}  # instance key -> worker
        self.device_workers: dict[str, asyncio.Task] = {}  # "cpu"/"gpu:N" -> its start
        self.restarts = RestartPolicy()
        self.stopping = False
        self._gen = itertools.count(1)
        self.timeouts: dict[str, float] = {}  # instance key -> execute timeout (s)
        # instance key -> (slot, batch id, monotonic deadline) of batches being watched
        self._running: dict[str, tuple[InstanceSlot, int, float]] = {}
        self._watch: asyncio.TimerHandle | None = None

    # -- instances ----------------------------------------------------------------------

    async def load_instance(self, slot: InstanceSlot, backend: str,
                            msg: LoadInstance) -> InstanceLoaded:
        """Place `slot` in a worker and load it there: a python instance gets a process
        of its own, a framework instance joins its device's worker."""
        if backend in DEVICE_WORKER_BACKENDS:
            worker = await self._device_worker(worker_device(slot.kind, slot.device_id))
            slot.queueable = True
        else:
            timeout = execute_timeout(msg.config, msg.backend_config)
            worker = await self._spawn(slot.key, **await self._exec_env(msg))
            self.timeouts[slot.key] = timeout
            # a batch waiting behind another would have its execute timeout counted
            # from when it was sent (batch_sent), not from when it starts
            slot.queueable = not timeout
        slot.worker = worker
        worker.slots.append(slot)
        self.worker_of[slot.key] = worker
        fut = self.loop.create_future()
        worker.loads[msg.instance] = fut
        self.outbox.send(worker.address, msg)
        return await asyncio.wait_for(fut, self.args.startup_timeout_secs)

    async def drop_instance(self, slot: InstanceSlot) -> None:
        """Undo a slot's placement (a failed load, an unload)."""
        worker = slot.worker
        if worker is None:
            return
        slot.worker = None
        self.worker_of.pop(slot.key, None)
        if slot in worker.slots:
            worker.slots.remove(slot)
        if worker.device:  # shared with other models' instances: unload just this one
            if worker.address in self.workers:
                self.outbox.send(worker.address, UnloadInstance(slot.key))
        else:
            await self._stop(worker)

    def broadcast(self, msg) -> None:
        # not to a worker told to stop: it may already be gone, which is no fault (a
        # peer-gone warning at every failed load or clean stop would cry wolf)
        for worker in self.workers.values():
            if not worker.stop_sent:
                self.outbox.send(worker.address, msg)

    # -- hung executes ------------------------------------------------------------------

    def batch_sent(self, slot: InstanceSlot, batch_id: int) -> None:
        """`slot` runs `batch_id` from now: watch it if its model has a timeout."""
        timeout = self.timeouts.get(slot.key)
        if not timeout:
            return
        self._running[slot.key] = (slot, batch_id, time.monotonic() + timeout)
        if self._watch is None:
            self._watch = self.loop.call_later(WATCH_PERIOD_S, self._check_running)

    def _check_running(self) -> None:
        self._watch = None
        now = time.monotonic()
        for key, (slot, batch_id, deadline) in list(self._running.items()):
            if slot.batch != batch_id or slot.worker is None:
                del self._running[key]  # done (or lost) in time
            elif now > deadline:
                del self._running[key]
                self._kill_hung(slot)
        if self._running and not self.stopping:
            self._watch = self.loop.call_later(WATCH_PERIOD_S, self._check_running)

    def _kill_hung(self, slot: InstanceSlot) -> None:
        """A python instance stuck in execute: its thread cannot be stopped from
        outside, so its process is killed; the death path fails its requests and
        restarts the instance, and the other instances keep serving."""
        worker = slot.worker
        if worker is None or worker.device or worker.child is None:
            return
        timeout = self.timeouts.get(slot.key, 0.0)
        worker.killed_for = (f"was killed: execute ran longer than the execute timeout "
                             f"of {timeout:g}s")
        log.error("instance '%s' is stuck in execute for more than %gs; killing its "
                  "process", slot.name, timeout)
        worker.child.signal(signal.SIGKILL)

    # -- processes ----------------------------------------------------------------------

    async def _device_worker(self, device: str) -> WorkerHandle:
        """The worker framework instances on `device` share, started on first use (and
        again after it died)."""
        task = self.device_workers.get(device)
        if task is not None and task.done() and (
                task.exception() is not None or task.result().address not in self.workers):
            task = None  # it failed to start, or died since
        if task is None:
            task = self.device_workers[device] = self.loop.create_task(
                self._spawn(f"{device} worker", device))
        return await asyncio.shield(task)

    async def _exec_env(self, msg: LoadInstance) -> dict:
        """The interpreter and environment of a python instance's worker: its model's
        EXECUTION_ENV_PATH (a tarball is unpacked off the loop), or this server's."""
        try:
            path = exec_env.env_path_of(msg.config, msg.model_dir)
            if not path:
                return {}
            root = await asyncio.to_thread(exec_env.prepare, path,
                                           exec_env.default_cache_dir())
        except exec_env.ExecEnvError as e:
            raise RuntimeError(str(e)) from None
        log.info("model '%s' runs in execution environment %s", msg.model, root)
        pkgs = exec_env.package_links(self.run_dir)
        return {"executable": exec_env.interpreter(root),
                "env": exec_env.child_environ(root, pkgs)}

    async def _spawn(self, label: str, device: str = "", executable: str = "",
                     env: dict[str, str] | None = None) -> WorkerHandle:
        gen = next(self._gen)
        address = ipc_address(self.run_dir, f"w{gen}")
        worker = WorkerHandle(label, address, f"{self.shm_prefix}w{gen}", device)
        worker.child = self.launcher(f"worker {label}", "workers.main", self.spec(worker).to_argv(),
                             on_exit=self._on_exit, executable=executable, env=env)
        self.workers[address] = worker
        worker.child.start(self.loop)
        await asyncio.wait_for(worker.ready, self.args.startup_timeout_secs)
        return worker

    def spec(self, worker: WorkerHandle) -> WorkerSpec:
        """What `worker` is told at its start; a device worker's `gpu:N` pins it to GPU
        N (it selects that device itself: see shm/devices.py for why not through
        CUDA_VISIBLE_DEVICES)."""
        return WorkerSpec(name=worker.name, address=worker.address,
                          scheduler=self.scheduler_address, segment_prefix=worker.prefix,
                          device=worker.device or "cpu",
                          cuda_sync=getattr(self.args, "cuda_sync", "auto"),
                          **child_fields(self.args))

    async def _stop(self, worker: WorkerHandle, timeout: float = 10.0) -> None:
        if worker.child is None or worker.child.returncode is not None:
            return
        worker.stop_sent = True
        self.outbox.send(worker.address, StopWorker())
        if not await worker.child.wait(timeout):
            await worker.child.stop(1.0)

    async def stop_all(self, timeout: float = 10.0) -> None:
        """StopWorker to each (they finalize their models), `timeout` seconds for them
        to exit (what the exit timeout left), then SIGTERM and SIGKILL."""
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await asyncio.gather(*(self._stop(w, timeout) for w in list(self.workers.values())))

    # -- messages and deaths ------------------------------------------------------------

    def on_worker_ready(self, msg: WorkerReady) -> None:
        worker = self.workers.get(msg.address)
        if worker is not None and not worker.ready.done():
            worker.ready.set_result(True)

    def on_instance_loaded(self, msg: InstanceLoaded) -> None:
        worker = self.worker_of.get(msg.instance)
        fut = worker.loads.pop(msg.instance, None) if worker is not None else None
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_exit(self, child: Child, returncode: int) -> None:
        worker = next((w for w in self.workers.values() if w.child is child), None)
        if worker is None:
            return
        del self.workers[worker.address]
        remove_segments(worker.prefix + "-")
        self.outbox.drop(worker.address)
        how = worker.killed_for or describe_exit(returncode)
        error = RuntimeError(f"worker process for {worker.name} {how} while starting")
        if not worker.ready.done():
            worker.ready.set_exception(error)
        for fut in worker.loads.values():
            if not fut.done():
                fut.set_exception(error)
        worker.loads.clear()
        if not self.stopping and worker.slots:
            # before PeerGone: a frontend that sent a request to it under a lease hears
            # why it failed (LeaseEnded, lost) before it hears that the worker is gone
            self._on_instances_lost(list(worker.slots), how)
        gone = PeerGone(worker.address, worker.prefix + "-")
        for peer in self._peers():
            self.outbox.send(peer, gone)
        # other workers too: through BLS they read its arena and hold blocks for it
        self.broadcast(gone)
