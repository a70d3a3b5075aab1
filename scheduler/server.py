"""The scheduler process's server: supervision, model loading and request routing.

One asyncio loop. The inbox delivers every message through one dispatch table; after
each burst of messages the model schedulers are pumped once, so requests that arrive
together are batched together.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from scheduler import config as cfg
from scheduler import repository
from scheduler.model_scheduler import InstanceSlot, ModelScheduler
from scheduler.models import ModelReadyState, ModelTable, ModelVersion
from scheduler.regions import Region, RegionRegistry
from scheduler.supervisor import Child, describe_exit
from scheduler.timer import PreciseTimer
from shm.arena import remove_segments
from shm import cuda
from shm.channel import Inbox, Outbox, ipc_address
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import (CancelRequest, Drain, FrontendReady, FrontendStopped,
                                   InferRequest, ModelStateUpdate, ServerState)
from shm.messages.regions import RegionGone, RegionReply, RegionRequest
from shm.messages.results import InferResponse, PeerGone
from shm.messages.scheduler import SCHEDULER_INBOX
from shm.messages.worker import (DEVICE_WORKER_BACKENDS, BatchDone, ExecuteBatch,
                                 InstanceLoaded, LoadInstance, StopWorker, UnloadInstance,
                                 WorkerReady)

log = logging.getLogger("shmserve.scheduler")

# A child that keeps dying is not restarted forever.
_MAX_RESTARTS = 5
_RESTART_WINDOW_S = 60.0


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


class FrontendHandle:
    def __init__(self, index: int, address: str, prefix: str):
        self.index = index
        self.address = address
        self.prefix = prefix
        self.child: Child | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stopped = False


class Server:
    def __init__(self, args):
        self.args = args
        self.loop = asyncio.get_running_loop()
        # Everything this server puts in /dev/shm starts with this prefix.
        self.shm_prefix = f"shmserve-{os.getpid():x}{secrets.token_hex(2)}-"
        self.run_dir = tempfile.mkdtemp(prefix="shmserve-")
        self.address = ipc_address(self.run_dir, "scheduler")
        self.inbox = Inbox(self.address, SCHEDULER_INBOX)
        self.outbox = Outbox(self.loop)
        self.models = ModelTable()
        self.by_instance: dict[str, ModelScheduler] = {}
        self.workers: dict[str, WorkerHandle] = {}  # by address
        self.worker_of: dict[str, WorkerHandle] = {}  # instance key -> worker
        self.device_workers: dict[str, asyncio.Task] = {}  # "cpu"/"gpu:N" -> its start
        self.frontends: dict[int, FrontendHandle] = {}
        self._gen = itertools.count(1)
        self._restarts: dict[str, list[float]] = {}
        self._dirty: set[ModelScheduler] = set()
        self.stopping = False
        self.stop_requested = asyncio.Event()
        self.timer = PreciseTimer(self.loop, self._on_timer)
        self.gpus = cuda.device_count()
        self.regions = RegionRegistry(args.allow_client_shm, self.gpus, self._region_gone)
        self.handlers = {
            InferRequest: self.on_infer,
            CancelRequest: self.on_cancel,
            BatchDone: self.on_batch_done,
            FrontendReady: self.on_frontend_ready,
            FrontendStopped: self.on_frontend_stopped,
            WorkerReady: self.on_worker_ready,
            InstanceLoaded: self.on_instance_loaded,
            InferResponse: self.on_internal_response,
            RegionRequest: self.on_region_call,
        }

    # -- the loop ---------------------------------------------------------------------

    def _dispatch(self, msg) -> None:
        self.handlers[type(msg)](msg)

    def _after_burst(self) -> None:
        if self._dirty:
            now = time.monotonic_ns()
            dirty, self._dirty = self._dirty, set()
            for ms in dirty:
                ms.pump(now)
            self._arm_timer()

    def _arm_timer(self) -> None:
        deadline = None
        for mv in self.models.all():
            ms = mv.scheduler
            if ms is not None and ms.idle:
                d = ms.batcher.next_deadline()
                if d is not None and (deadline is None or d < deadline):
                    deadline = d
        self.timer.set(deadline)

    def _on_timer(self) -> None:
        now = time.monotonic_ns()
        for mv in self.models.all():
            if mv.scheduler is not None:
                mv.scheduler.pump(now)
        self._arm_timer()

    async def run(self) -> int:
        self.inbox.attach(self.loop, self._dispatch, after_burst=self._after_burst)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self.request_stop)
        code = 0
        try:
            ok = await self.load_repository()
            for line in self.models.state_table().splitlines():
                log.info("%s", line)
            if not ok and self.args.exit_on_error:
                log.error("exiting: some models failed to load (--exit-on-error=true)")
                code = 1
            elif not self.stop_requested.is_set():
                await self.start_frontends()
                log.info("Started HTTPService at %s:%d", self.args.http_address,
                         self.args.http_port)
                log.info("Started GRPCInferenceService at %s:%d", self.args.grpc_address,
                         self.args.grpc_port)
                await self.stop_requested.wait()
        except Exception:
            log.exception("server failed")
            code = 1
        finally:
            await self.shutdown()
        return code

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stopping: draining in-flight requests (up to %.0fs)",
                     self.args.exit_timeout_secs)
            self.stop_requested.set()

    # -- model loading ----------------------------------------------------------------

    async def load_repository(self) -> bool:
        try:
            sources = repository.scan([os.path.abspath(p) for p in self.args.model_repository])
        except Exception as exc:
            log.error("%s", exc)
            return False
        if self.args.model_control_mode == "explicit":
            wanted = set(self.args.load_model)
            if "*" not in wanted:
                sources = {n: s for n, s in sources.items() if n in wanted}
        results = await asyncio.gather(*(self.load_model(s) for s in sources.values()))
        return all(results)

    async def load_model(self, source) -> bool:
        try:
            if self.args.strict_model_config and not (source.path / "config.pbtxt").is_file():
                raise cfg.ConfigError(
                    f"model '{source.name}' has no config.pbtxt, which "
                    "--strict-model-config=true requires")
            plan = repository.plan_model(source, has_gpu=self.gpus > 0,
                                         gpu_ids=list(range(self.gpus)))
        except Exception as exc:
            mv = ModelVersion(source.name, 0, str(source.path),
                              state=ModelReadyState.UNAVAILABLE, reason=str(exc))
            self.models.add(mv)
            self.publish(mv)
            return False
        results = await asyncio.gather(*(self.load_version(plan, v) for v in plan.versions))
        return all(results)

    async def load_version(self, plan, version: int) -> bool:
        mv = ModelVersion(plan.name, version, str(plan.path), config=plan.config)
        self.models.add(mv)
        self.publish(mv)
        slots = []
        for group in plan.config.instance_group:
            for i in range(group.count):
                name = f"{group.name}_{i}"
                device = group.gpus[i % len(group.gpus)] if group.gpus else 0
                kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
                slots.append(InstanceSlot(f"{plan.name}/{version}/{name}", name, kind, device))
        try:
            # The first instance may auto-complete the config the others then get.
            config = await self._start_instance(mv, slots[0], mv.config,
                                                auto_complete=not self.args.strict_model_config)
            mv.config = config
            mv.config_json = b""  # printed again from the completed config
            await asyncio.gather(*(self._start_instance(mv, s, config) for s in slots[1:]))
        except Exception as exc:
            log.error("failed to load '%s' version %d: %s", plan.name, version, exc)
            mv.state = ModelReadyState.UNAVAILABLE
            mv.reason = str(exc)
            for slot in slots:
                await self._drop_instance(slot)
            self.publish(mv)
            return False
        ms = ModelScheduler(plan.name, version, mv.config, self._send_batch, self._fail)
        mv.scheduler = ms
        mv.slots = slots
        for slot in slots:
            ms.add_instance(slot)
            self.by_instance[slot.key] = ms
        mv.state = ModelReadyState.READY
        log.info("successfully loaded '%s' version %d", plan.name, version)
        self.publish(mv)
        return True

    async def _start_instance(self, mv: ModelVersion, slot: InstanceSlot, config,
                              auto_complete: bool = False):
        """Place `slot` in a worker and load it there: a python instance gets a process
        of its own, a framework instance joins its device's worker."""
        if config.backend in DEVICE_WORKER_BACKENDS:
            device = f"gpu:{slot.device_id}" if slot.kind == "KIND_GPU" else "cpu"
            worker = await self._device_worker(device)
        else:
            worker = await self._spawn_worker(slot.key)
        slot.worker = worker
        worker.slots.append(slot)
        self.worker_of[slot.key] = worker
        config_json = json.dumps(cfg.config_to_json(config)).encode()
        reply = await self._load(worker, LoadInstance(
            slot.key, slot.name, mv.name, mv.version, mv.path, config_json,
            kind=slot.kind, device_id=slot.device_id, auto_complete=auto_complete,
            backend_config=self.args.backend_config.get(config.backend, {})))
        if not reply.ok:
            raise RuntimeError(reply.error)
        if auto_complete and reply.config and reply.config != config_json:
            completed = json_format.ParseDict(json.loads(reply.config),
                                              model_config_pb2.ModelConfig(),
                                              ignore_unknown_fields=True)
            completed = cfg.normalize(completed, has_gpu=self.gpus > 0,
                                      gpu_ids=list(range(self.gpus)))
            cfg.validate(completed, gpu_ids=list(range(self.gpus)) if self.gpus else [])
            return completed
        return config

    async def _device_worker(self, device: str) -> WorkerHandle:
        """The worker framework instances on `device` share, started on first use (and
        again after it died)."""
        task = self.device_workers.get(device)
        if task is not None and task.done() and (
                task.exception() is not None or task.result().address not in self.workers):
            task = None  # it failed to start, or died since
        if task is None:
            task = self.device_workers[device] = self.loop.create_task(
                self._spawn_worker(f"{device} worker", device))
        return await asyncio.shield(task)

    async def _drop_instance(self, slot: InstanceSlot) -> None:
        """Undo a slot's placement after a failed load."""
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
            await self._stop_worker(worker)

    async def _load(self, worker: WorkerHandle, msg: LoadInstance) -> InstanceLoaded:
        fut = self.loop.create_future()
        worker.loads[msg.instance] = fut
        self.outbox.send(worker.address, msg)
        return await asyncio.wait_for(fut, self.args.startup_timeout_secs)

    async def _spawn_worker(self, label: str, device: str = "") -> WorkerHandle:
        gen = next(self._gen)
        address = ipc_address(self.run_dir, f"w{gen}")
        worker = WorkerHandle(label, address, f"{self.shm_prefix}w{gen}", device)
        worker.child = Child(f"worker {label}", "workers.main", [
            "--name", label, "--address", address, "--scheduler", self.address,
            "--segment-prefix", worker.prefix, "--arena-bytes", str(self.args.arena_mib << 20),
            "--device", device or "cpu", "--log-verbose", str(self.args.log_verbose),
        ], on_exit=self._on_worker_exit)
        self.workers[address] = worker
        worker.child.start(self.loop)
        await asyncio.wait_for(worker.ready, self.args.startup_timeout_secs)
        return worker

    async def _stop_worker(self, worker: WorkerHandle, timeout: float = 10.0) -> None:
        if worker.child is None or worker.child.returncode is not None:
            return
        self.outbox.send(worker.address, StopWorker())
        if not await worker.child.wait(timeout):
            await worker.child.stop(2.0)

    def publish(self, mv: ModelVersion) -> None:
        """Tell every frontend about a model version's state."""
        msg = self._state_update(mv)
        for fe in self.frontends.values():
            self.outbox.send(fe.address, msg)

    def _state_update(self, mv: ModelVersion) -> ModelStateUpdate:
        if mv.config is not None and not mv.config_json:
            mv.config_json = json.dumps(cfg.config_to_json(mv.config)).encode()
        return ModelStateUpdate(
            mv.name, mv.version, mv.state.value, mv.reason,
            config=mv.config.SerializeToString() if mv.config is not None else b"",
            config_json=mv.config_json)

    # -- requests ---------------------------------------------------------------------

    def on_infer(self, req: InferRequest) -> None:
        mv = self.models.resolve(req.model, req.version)
        if mv is None or mv.scheduler is None or mv.state is not ModelReadyState.READY:
            what = f"'{req.model}'" + (f" version {req.version}" if req.version else "")
            self._fail(req, ErrorCode.UNAVAILABLE, f"model {what} is not ready")
            return
        try:
            self.regions.resolve(req)  # names of client regions, if the request has any
        except InferError as exc:
            self._fail(req, exc.code, exc.message)
            return
        ms = mv.scheduler
        ms.enqueue(req, time.monotonic_ns())
        self._dirty.add(ms)

    def on_cancel(self, msg: CancelRequest) -> None:
        for mv in self.models.all():
            if mv.scheduler is not None and mv.scheduler.cancel(msg.reply_to, msg.id):
                return

    def on_batch_done(self, msg: BatchDone) -> None:
        ms = self.by_instance.get(msg.instance)
        if ms is not None:
            requests = ms.batch_done(msg.batch_id)
            if msg.copies:
                ms.copies[msg.instance] = msg.copies
            if self.regions.users:
                for req in requests:
                    self.regions.finished(req)
            self._dirty.add(ms)

    def _send_batch(self, slot: InstanceSlot, batch: ExecuteBatch) -> None:
        self.outbox.send(slot.worker.address, batch)

    def _fail(self, req: InferRequest, code: ErrorCode, reason: str) -> None:
        self.outbox.send(req.reply_to, InferResponse(req.id, error=reason, error_code=int(code)))
        if self.regions.users:
            self.regions.finished(req)

    # -- client shared-memory regions -------------------------------------------------

    def on_region_call(self, call: RegionRequest) -> None:
        def answer(error: InferError | None = None, regions=()) -> None:
            reply = RegionReply(call.call_id, regions=list(regions))
            if error is not None:
                reply.error, reply.error_code = error.message, int(error.code)
            self.outbox.send(call.reply_to, reply)

        try:
            if call.op == "register":
                self.regions.register(call)
                log.info("registered %s shared memory region '%s'", call.kind, call.name)
                answer()
            elif call.op == "status":
                answer(regions=self.regions.status(call.kind, call.name))
            elif call.op == "unregister":
                # answered once no request uses the region(s) any more
                self.regions.unregister(call.kind, call.name, answer)
            else:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"unknown shared memory operation '{call.op}'")
        except InferError as exc:
            answer(exc)

    def _region_gone(self, region: Region) -> None:
        log.info("unregistered %s shared memory region '%s'", region.kind, region.name)
        gone = RegionGone(region.uid)
        for worker in self.workers.values():
            self.outbox.send(worker.address, gone)

    def on_internal_response(self, msg: InferResponse) -> None:
        # The scheduler asks for nothing yet (ensembles, BLS and warmup will).
        log.warning("unexpected response to internal request %d", msg.id)

    # -- workers ----------------------------------------------------------------------

    def on_worker_ready(self, msg: WorkerReady) -> None:
        worker = self.workers.get(msg.address)
        if worker is not None and not worker.ready.done():
            worker.ready.set_result(True)

    def on_instance_loaded(self, msg: InstanceLoaded) -> None:
        worker = self.worker_of.get(msg.instance)
        fut = worker.loads.pop(msg.instance, None) if worker is not None else None
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_worker_exit(self, child: Child, returncode: int) -> None:
        worker = next((w for w in self.workers.values() if w.child is child), None)
        if worker is None:
            return
        del self.workers[worker.address]
        remove_segments(worker.prefix + "-")
        self.outbox.drop(worker.address)
        gone = PeerGone(worker.address, worker.prefix + "-")
        for fe in self.frontends.values():
            self.outbox.send(fe.address, gone)
        how = describe_exit(returncode)
        error = RuntimeError(f"worker process for {worker.name} {how} while starting")
        if not worker.ready.done():
            worker.ready.set_exception(error)
        for fut in worker.loads.values():
            if not fut.done():
                fut.set_exception(error)
        worker.loads.clear()
        if self.stopping:
            return
        for slot in worker.slots:
            ms = self.by_instance.get(slot.key)
            if ms is None:
                continue  # it was never loaded
            failed = ms.instance_lost(slot.key, (
                f"the worker process running instance '{slot.name}' of model "
                f"'{ms.name}' {how}; the request was lost and the instance is restarting"))
            log.error("worker for instance '%s' of '%s' %s; %d in-flight request(s) failed",
                      slot.name, ms.name, how, failed)
            self.loop.create_task(self._restart_instance(ms, slot))

    async def _restart_instance(self, ms: ModelScheduler, slot: InstanceSlot) -> None:
        if not self._may_restart(slot.key):
            log.error("instance '%s' of '%s' keeps dying; not restarting it", slot.name,
                      ms.name)
            self._mark_unavailable_if_empty(ms, "every instance failed repeatedly")
            return
        mv = self.models.resolve(ms.name, ms.version)
        try:
            await self._start_instance(mv, slot, ms.config)
        except Exception as exc:
            log.error("could not restart instance '%s' of '%s': %s", slot.name, ms.name, exc)
            self._mark_unavailable_if_empty(ms, f"instance restart failed: {exc}")
            return
        if self.stopping:
            return
        ms.instance_back(slot.key)
        self._dirty.add(ms)
        self._after_burst()
        log.info("instance '%s' of '%s' is back", slot.name, ms.name)

    def _mark_unavailable_if_empty(self, ms: ModelScheduler, reason: str) -> None:
        if ms.live_instances:
            return
        mv = self.models.resolve(ms.name, ms.version)
        if mv is None:
            return
        mv.state = ModelReadyState.UNAVAILABLE
        mv.reason = reason
        ms.fail_all(ErrorCode.UNAVAILABLE, f"model '{ms.name}' is unavailable: {reason}")
        self.publish(mv)

    def _may_restart(self, key: str) -> bool:
        now = time.monotonic()
        times = [t for t in self._restarts.get(key, []) if now - t < _RESTART_WINDOW_S]
        times.append(now)
        self._restarts[key] = times
        return len(times) <= _MAX_RESTARTS

    # -- frontends --------------------------------------------------------------------

    async def start_frontends(self) -> None:
        starts = [self._spawn_frontend(i) for i in range(self.args.frontend_processes)]
        await asyncio.gather(*starts)

    async def _spawn_frontend(self, index: int) -> FrontendHandle:
        gen = next(self._gen)
        address = ipc_address(self.run_dir, f"f{index}g{gen}")
        fe = FrontendHandle(index, address, f"{self.shm_prefix}f{index}g{gen}")
        a = self.args
        fe.child = Child(f"frontend {index}", "frontend.main", [
            "--index", str(index), "--address", address, "--scheduler", self.address,
            "--segment-prefix", fe.prefix, "--arena-bytes", str(a.arena_mib << 20),
            "--http-address", a.http_address, "--http-port", str(a.http_port),
            "--grpc-address", a.grpc_address, "--grpc-port", str(a.grpc_port),
            "--allow-http", str(a.allow_http).lower(), "--allow-grpc", str(a.allow_grpc).lower(),
            "--log-verbose", str(a.log_verbose),
        ], on_exit=self._on_frontend_exit)
        self.frontends[index] = fe
        fe.child.start(self.loop)
        await asyncio.wait_for(fe.ready, self.args.startup_timeout_secs)
        return fe

    def on_frontend_ready(self, msg: FrontendReady) -> None:
        fe = self.frontends.get(msg.index)
        if fe is None or fe.address != msg.address:
            return
        for mv in self.models.all():
            self.outbox.send(fe.address, self._state_update(mv))
        self.outbox.send(fe.address, ServerState(ready=not self.stopping, stopping=self.stopping))
        if not fe.ready.done():
            fe.ready.set_result(True)

    def on_frontend_stopped(self, msg: FrontendStopped) -> None:
        fe = self.frontends.get(msg.index)
        if fe is not None:
            fe.stopped = True
            if msg.abandoned:
                log.warning("frontend %d stopped with %d request(s) still in flight",
                            msg.index, msg.abandoned)

    def _on_frontend_exit(self, child: Child, returncode: int) -> None:
        fe = next((f for f in self.frontends.values() if f.child is child), None)
        if fe is None:
            return
        remove_segments(fe.prefix + "-")
        self.outbox.drop(fe.address)
        gone = PeerGone(fe.address, fe.prefix + "-")
        for worker in self.workers.values():
            self.outbox.send(worker.address, gone)
        if not fe.ready.done():
            fe.ready.set_exception(RuntimeError(
                f"frontend {fe.index} {describe_exit(returncode)} while starting "
                "(is a port in use?)"))
            return
        if self.stopping:
            return
        log.error("frontend %d %s; restarting it", fe.index, describe_exit(returncode))
        if self._may_restart(f"frontend{fe.index}"):
            self.loop.create_task(self._spawn_frontend(fe.index))

    # -- shutdown ---------------------------------------------------------------------

    async def shutdown(self) -> None:
        self.stopping = True
        timeout = self.args.exit_timeout_secs
        # 1. frontends stop taking requests and finish those in flight
        for fe in self.frontends.values():
            self.outbox.send(fe.address, Drain(timeout))
        await asyncio.gather(*(fe.child.wait(timeout + 5.0) for fe in self.frontends.values()
                               if fe.child is not None))
        await asyncio.gather(*(fe.child.stop(2.0) for fe in self.frontends.values()
                               if fe.child is not None))
        # 2. workers finalize their models and free their arenas
        for mv in self.models.all():
            if mv.scheduler is not None and mv.scheduler.batch_sizes:
                log.info("%s", mv.scheduler.summary())
        for mv in self.models.all():
            if mv.scheduler is not None:
                mv.scheduler.fail_all(ErrorCode.UNAVAILABLE, "server is stopping")
        await asyncio.gather(*(self._stop_worker(w) for w in list(self.workers.values())))
        # 3. whatever a killed child left behind
        leftovers = remove_segments(self.shm_prefix)
        if leftovers:
            log.warning("removed %d shared-memory segment(s) left by dead processes",
                        len(leftovers))
        self.timer.close()
        self.inbox.close()
        self.outbox.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        log.info("server stopped")
