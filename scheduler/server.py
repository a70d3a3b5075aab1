"""The scheduler process's loop: every message in, through one dispatch table.

One asyncio loop. The inbox delivers every message; after each burst the model
schedulers it touched are pumped once, so requests that arrive together are batched
together, and a precise timer wakes the loop for the earliest batching deadline.
Most batches end in a quiet inbox (callbacks.send_batch): their BatchDone wakes the loop only
while a request waits for an instance; otherwise it is read on the next wake, once what
that wake sends is out, so at c=1 the scheduler wakes once per request, not twice. The
rooms around it: the model manager (loading, states), the worker pool and the frontend
pool (processes), the rate limiter (instances), the region registry (client shm), the
response cache. Schedulers reach the process through one Callbacks object
(callbacks.py); control calls go from the dispatch table straight to their owners.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time

import orjson

from scheduler import bls
from scheduler.callbacks import LoopCallbacks, not_ready
from scheduler.cache import ResponseCache
from scheduler.processes.frontend_pool import FrontendHandle, FrontendPool, PortInUse
from scheduler.metrics import Metrics, MetricsServer
from scheduler.repository.control import ModelControl
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.repository.models import ModelReadyState
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.regions import Region, RegionRegistry
from scheduler.scheduling.interface import InstanceScheduler
from scheduler.timer import PreciseTimer
from scheduler.trace import TraceManager
from scheduler.processes.supervisor import Child
from scheduler.processes.worker_pool import WorkerPool
from scheduler.settings import SettingsCalls
from shm import devices
from shm.arena import remove_segments
from shm.channel import ipc_address
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import (CacheInsert, CancelRequest, FrontendReady,
                                   FrontendStopped, InferRequest, RequestOrigin, ServerState,
                                   StatsRequest)
from shm.messages.regions import RegionGone, RegionRequest
from shm.messages.repository import RepositoryRequest
from shm.messages.results import InferResponse, ReleaseBlocks
from shm.messages.scheduler import SCHEDULER_INBOX
from shm.messages.settings import LogSettingsRequest, TraceSettingRequest
from shm.messages.worker import (BatchDone, InstanceLoaded, ResponseStats, WorkerReady,
                                 done_address)
from shm.transport import SOCKETS, Transport

log = logging.getLogger("shmserve.scheduler")


class Server:
    """`transport` makes the channels (Unix sockets; shm/transport.py's MemoryHub in
    loop tests), `launcher` starts the children (scheduler/processes/supervisor.py's
    Child, or an in-process fake), `timer` wakes the loop at a batching deadline
    (PreciseTimer, or one a test fires)."""

    def __init__(self, args, transport: Transport = SOCKETS, launcher=Child,
                 timer=PreciseTimer):
        self.args = args
        self.loop = asyncio.get_running_loop()
        # Everything this server puts in /dev/shm starts with this prefix; the root
        # process (scheduler/processes/root.py) chooses it, and the socket directory, so
        # that it can clean up after a scheduler that was killed.
        self.shm_prefix = getattr(args, "shm_prefix", "") or \
            f"shmserve-{os.getpid():x}{secrets.token_hex(2)}-"
        self.run_dir = getattr(args, "run_dir", "") or tempfile.mkdtemp(prefix="shmserve-")
        self.address = ipc_address(self.run_dir, "scheduler")
        self.inbox = transport.inbox(self.address, SCHEDULER_INBOX)
        # BatchDone of quiet batches (callbacks.send_batch): watched only while it matters
        self.done_inbox = transport.inbox(done_address(self.address), (BatchDone,))
        self._drained = False  # the quiet inbox was read in this burst
        self._waiting: set[InstanceScheduler] = set()  # pumped with requests still queued
        # SHMSERVE_WAKE_COUNTS=PATH: what woke this loop, as JSON at exit (tests, tools)
        self.wakes: collections.Counter = collections.Counter()
        self.outbox = transport.outbox(self.loop)
        self.stopping = False
        self.stop_requested = asyncio.Event()
        self.metrics: MetricsServer | None = None
        self._dirty: set[InstanceScheduler] = set()
        self._deadlines: dict[InstanceScheduler, int] = {}  # when each must be pumped again
        self.timer = timer(self.loop, self._on_timer)
        self.gpus = devices.gpu_count()  # SHMSERVE_FAKE_GPUS injects a count
        self.regions = RegionRegistry(args.allow_client_shm, self.gpus, self._region_gone,
                                      send=self.outbox.send)
        self.trace = TraceManager(args.trace_config)
        self.cache = ResponseCache(args.cache_bytes) if args.cache_bytes > 0 else None
        self.rate_limiter = RateLimiter(args.rate_limit == "execution_count",
                                        args.rate_limit_resource)
        self.workers = WorkerPool(args, self.run_dir, self.shm_prefix, self.address,
                                  self.outbox, peers=lambda: self.frontends.addresses(),
                                  on_instances_lost=self._instances_lost, launcher=launcher)
        self.frontends = FrontendPool(args, self.run_dir, self.shm_prefix, self.address,
                                      self.outbox, self.workers.restarts,
                                      on_gone=self._frontend_gone,
                                      on_ready=self._frontend_ready, launcher=launcher)
        # what schedulers ask of this process, ensemble steps included
        self.callbacks = LoopCallbacks(self.loop, self.address, self.outbox, self.workers,
                                       self.trace, self.regions, self._dirty,
                                       self._after_burst, self.on_cancel)
        self.manager = ModelRepositoryManager(
            args, self.workers, self.rate_limiter, self.gpus,
            publish=self.frontends.broadcast, callbacks=self.callbacks)
        self.callbacks.models = self.manager.models
        self.callbacks.by_instance = self.manager.by_instance
        self._quiet = self.callbacks.quiet  # quiet batches whose BatchDone is not read yet
        self.control = ModelControl(self.manager, args, send=self.outbox.send)
        settings = SettingsCalls(args, self.trace, self.manager, self.outbox.send,
                                 (self.frontends.broadcast, self.workers.broadcast))
        self.handlers = {
            InferRequest: self.on_infer,
            CancelRequest: self.on_cancel,
            BatchDone: self.on_batch_done,
            ResponseStats: self.on_response_stats,
            FrontendReady: self.frontends.on_frontend_ready,
            FrontendStopped: self.frontends.on_frontend_stopped,
            WorkerReady: self.workers.on_worker_ready,
            InstanceLoaded: self.workers.on_instance_loaded,
            InferResponse: self.callbacks.on_response,
            ReleaseBlocks: self.callbacks.on_release,
            CacheInsert: self.on_cache_insert,
            # control calls, answered by their owners
            RegionRequest: self.regions.on_call,
            RepositoryRequest: self.control.on_call,
            StatsRequest: settings.on_stats,
            LogSettingsRequest: settings.on_log_settings,
            TraceSettingRequest: settings.on_trace_setting,
        }

    # -- the loop -----------------------------------------------------------------------

    def _dispatch(self, msg) -> None:
        # what the handlers send is written once, after the burst (_after_burst)
        self.outbox.cork()
        kind = type(msg)
        if kind is not InferRequest and self._quiet and not self._drained:
            # what a call reads (statistics, in-flight batches) counts every batch that
            # ended; a request's burst reads them after its own batch is out
            self._drain_done()
        self.handlers[kind](msg)

    def _dispatch_done(self, msg: BatchDone) -> None:
        self.outbox.cork()
        self.wakes["quiet BatchDone"] += 1
        self.on_batch_done(msg)

    def _after_quiet_burst(self) -> None:
        self.wakes["quiet inbox wake"] += 1
        self._after_burst()

    def _drain_done(self) -> None:
        self._drained = True
        self.done_inbox.drain()

    def _after_burst(self) -> None:
        try:
            self._pump_dirty()
        finally:
            self.outbox.uncork()
        if self._quiet and not self._drained:
            # the batch ends that came since this loop last looked, read once what this
            # burst sent is written (off the path of the request that woke it); what
            # they freed is pumped
            self._drain_done()
            try:
                self._pump_dirty()
            finally:
                self.outbox.uncork()
        self._drained = False
        self._watch_done()

    def _pump_dirty(self) -> None:
        if self._dirty:
            now = time.monotonic_ns()
            # emptied in place: the callbacks hold the set (pump_soon)
            dirty = tuple(self._dirty)
            self._dirty.clear()
            for sched in dirty:
                self._pump(sched, now)
            self._arm_timer()

    def _watch_done(self) -> None:
        """Wake for quiet BatchDones only while something waits on one: requests
        queued (for an instance, or for resources an instance holds), a version
        draining, the server stopping. Otherwise the next wake reads them."""
        waiting = self._waiting
        if waiting:
            waiting.difference_update([s for s in waiting if not s.pending])
        self.done_inbox.watch(bool(waiting) or bool(self.manager.retiring) or self.stopping)

    def _pump(self, sched: InstanceScheduler, now: int) -> None:
        """Run a scheduler and note when it must run again. Only a scheduler that was
        pumped can have a new deadline: every event that could move one earlier (a
        request, a finished batch, an instance back) marks its scheduler dirty."""
        sched.pump(now)
        if sched.pending:
            self._waiting.add(sched)
        deadline = sched.next_deadline()
        if deadline is None:
            self._deadlines.pop(sched, None)
        else:
            self._deadlines[sched] = deadline

    def _arm_timer(self) -> None:
        if self._deadlines:
            self.timer.set(min(self._deadlines.values()))

    def _on_timer(self) -> None:
        self.outbox.cork()
        self.wakes["timer"] += 1
        try:
            now = time.monotonic_ns()
            for sched, deadline in list(self._deadlines.items()):
                if deadline <= now:
                    self._pump(sched, now)
            self._arm_timer()
        finally:
            self.outbox.uncork()
        self._after_burst()  # the batch ends that came, and what they free

    async def run(self) -> int:
        self.inbox.attach(self.loop, self._dispatch, after_burst=self._after_burst)
        self.done_inbox.attach(self.loop, self._dispatch_done,
                               after_burst=self._after_quiet_burst, pausable=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self.request_stop)
        code = 0
        try:
            self.frontends.claim_ports()  # a taken port fails now, before models load
            ok = await self.manager.load_repository()
            await self.control.replay()  # after a restart by the root: the API's calls
            self.control.start()
            for line in self.manager.models.state_table().splitlines():
                log.info("%s", line)
            if not ok and self.args.exit_on_error:
                log.error("exiting: some models failed to load (--exit-on-error=true)")
                code = 1
            elif not self.stop_requested.is_set():
                await self._start_metrics()
                await self.frontends.start()
                log.info("Started HTTPService at %s:%d", self.args.http_address,
                         self.args.http_port)
                log.info("Started GRPCInferenceService at %s:%d", self.args.grpc_address,
                         self.args.grpc_port)
                await self.stop_requested.wait()
        except PortInUse as exc:
            log.error("exiting: %s", exc)
            code = 1
        except Exception:
            log.exception("server failed")
            code = 1
        finally:
            await self.shutdown()
        return code

    async def _start_metrics(self) -> None:
        a = self.args
        if not a.allow_metrics:
            return
        metrics = Metrics(self.manager, a.metrics_config, cpu=a.allow_cpu_metrics,
                          gpu=a.allow_gpu_metrics and self.gpus > 0)
        metrics.settle = self._settle
        self.metrics = MetricsServer(metrics, a.metrics_address, a.metrics_port,
                                     a.metrics_interval_ms)
        await self.metrics.start()
        log.info("Started Metrics Service at %s:%d", a.metrics_address, a.metrics_port)

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stopping: draining in-flight requests (up to %.0fs)",
                     self.args.exit_timeout_secs)
            self.stop_requested.set()

    # -- requests -----------------------------------------------------------------------

    def on_infer(self, req: InferRequest) -> None:
        mv = self.manager.models.resolve(req.model, req.version)
        if req.origin is RequestOrigin.BLS:  # checked here as a frontend would
            try:
                bls.admit(req, mv)
            except InferError as exc:
                self.callbacks.fail(req, exc.code, bls.refusal(req, exc.message))
                return
        if mv is None or mv.scheduler is None or mv.state is not ModelReadyState.READY:
            self.callbacks.fail(req, ErrorCode.UNAVAILABLE, not_ready(req).message)
            return
        sched = mv.scheduler
        now = time.monotonic_ns()
        # frontends set a key only for models that cache; the lookup is the queue's
        # front door, as in Triton's scheduler (a hit never enters the queue)
        if req.cache_key and self.cache is not None and self._answer_from_cache(req, mv, now):
            return
        if self.trace.active:  # the one check a request pays while tracing is off
            req.trace_id = self.trace.sample(req.model, mv.version, req.request_id)
        try:
            self.regions.resolve(req)  # names of client regions, if the request has any
            sched.enqueue(req, now)
        except InferError as exc:
            self.callbacks.fail(req, exc.code,
                                bls.refusal(req, exc.message)
                                if req.origin is RequestOrigin.BLS else exc.message)

    def _answer_from_cache(self, req: InferRequest, mv, now: int) -> bool:
        start = time.monotonic_ns()
        entry = self.cache.lookup(req.cache_key)
        end = time.monotonic_ns()
        if entry is None:
            req.cache_lookup_ns = end - start  # counted as cache_miss time if it runs
            return False
        req.queue_ns = now
        self.outbox.send(req.reply_to, InferResponse(req.id, outputs=entry.outputs,
                                                     model_version=mv.version,
                                                     cache_hit=True))
        mv.scheduler.stats.cache_hit(req, start, end, time.monotonic_ns())
        return True

    def on_cache_insert(self, msg: CacheInsert) -> None:
        if self.cache is None:
            return
        start = time.monotonic_ns()
        if not self.cache.insert(msg.key, msg.model, msg.version, msg.outputs):
            log.debug("response of '%s' version %d not cached: larger than the cache",
                      msg.model, msg.version)
        insert_ns = time.monotonic_ns() - start
        mv = self.manager.models.resolve(msg.model, msg.version)
        if mv is not None and mv.scheduler is not None:
            mv.scheduler.stats.cache_inserted(insert_ns)

    def on_cancel(self, msg: CancelRequest) -> None:
        now = time.monotonic_ns()
        for sched in list(self.manager.schedulers()):
            if sched.cancel(msg.reply_to, msg.id, now):
                return
        # running: the model sees request.is_cancelled() in the worker running it
        for sched in self.manager.instance_schedulers():
            address = sched.running_on(msg.reply_to, msg.id)
            if address:
                self.outbox.send(address, msg)
                return

    def on_response_stats(self, msg: ResponseStats) -> None:
        sched = self.manager.by_instance.get(msg.instance)
        if sched is not None:
            sched.stats.responses_sent(msg.responses)
            sched.request_complete(msg.reply_to, msg.id)

    def on_batch_done(self, msg: BatchDone) -> None:
        self.wakes["BatchDone"] += 1
        self._quiet.discard(msg.batch_id)
        sched = self.manager.by_instance.get(msg.instance)
        if sched is None:
            return
        now = time.monotonic_ns()
        requests, woken = sched.batch_done(msg, now)
        if self.callbacks.internal:
            self.callbacks.batch_ran(requests, msg)
        if self.trace.pending or self.regions.users:  # else nothing to record per request
            for req in requests:
                self.callbacks.request_ended(req, msg, now)
        self._dirty.update(woken)

    def _instances_lost(self, slots: list[InstanceSlot], how: str) -> None:
        drained = bool(self._quiet)
        if drained:  # batches that finished before the worker died are not lost
            self.done_inbox.drain()
            self._quiet.difference_update(slot.batch for slot in slots)
        if "SIGBUS" in how:
            self._quarantine_regions(slots)
        self.manager.instances_lost(slots, how)
        if drained:
            self._after_burst()  # send what the drain answered; pump what it freed

    def _quarantine_regions(self, slots: list[InstanceSlot]) -> None:
        """A worker died of SIGBUS running requests that read client regions. Workers
        read and write clients' objects with preadv/pwrite (shm/regions.py), so this is
        the backstop for a path nobody foresaw (a backend reading a region in place).
        The regions are unregistered, and the restart is not held against the
        instance; the other requests in flight on that worker still fail with it."""
        running = [req for slot in slots
                   if (sched := self.manager.by_instance.get(slot.key)) is not None
                   for req in sched.running(slot)]
        if self.regions.quarantine(running):
            for slot in slots:
                self.workers.restarts.forgive(slot.key)

    def _frontend_gone(self, msg) -> None:
        """A frontend died: workers forget it, and the ensemble outputs it held go back
        to their owners (it will never release them). Its requests still queued are
        dropped: their inputs lie in its arena, which died with it."""
        self.workers.broadcast(msg)
        now = time.monotonic_ns()
        dropped = 0
        for sched in self.manager.schedulers():
            for req in sched.drop_from(msg.address, now):
                dropped += 1
                self.callbacks.request_ended(req, None, now)
        if dropped:
            log.warning("dropped %d queued request(s) of a frontend that died", dropped)
        self.callbacks.reader_gone(msg.address)

    # -- processes ----------------------------------------------------------------------

    def _region_gone(self, region: Region) -> None:
        log.info("unregistered %s shared memory region '%s'", region.kind, region.name)
        self.workers.broadcast(RegionGone(region.uid))

    def _frontend_ready(self, fe: FrontendHandle) -> None:
        for mv in self.manager.models.all():
            self.outbox.send(fe.address, self.manager.state_update(mv))
        self.outbox.send(fe.address, ServerState(ready=not self.stopping, stopping=self.stopping,
                                                 strict=self.args.strict_readiness))

    def _settle(self) -> None:
        """Read the quiet BatchDones that came, outside a burst (a metrics scrape, the
        shutdown), and send what that frees."""
        if self._quiet:
            self.done_inbox.drain()
            self._after_burst()

    def _dump_wakes(self) -> None:
        path = os.environ.get("SHMSERVE_WAKE_COUNTS")
        if path:
            with open(path, "wb") as f:
                f.write(orjson.dumps(dict(self.wakes)))

    # -- shutdown -----------------------------------------------------------------------

    async def shutdown(self) -> None:
        self.stopping = self.manager.stopping = self.outbox.stopping = True
        self.done_inbox.watch(True)  # whatever still runs ends promptly
        await self.control.stop_polling()  # nothing loads while we stop
        # 1. frontends stop taking requests and finish those in flight, which still
        #    run: queued requests are batched and executed meanwhile
        await self.frontends.drain(self.args.exit_timeout_secs)
        # 2. workers finalize their models and free their arenas
        self._settle()  # what ran is counted, not failed
        now = time.monotonic_ns()
        for sched in self.manager.schedulers():
            if sched.stats.execution_count:
                log.info("%s", sched.summary())
            sched.fail_all(ErrorCode.UNAVAILABLE, "server is stopping", now)
        if self.callbacks.lent:
            log.warning("%d ensemble output block(s) were never released by their clients",
                        len(self.callbacks.lent))
        await self.workers.stop_all()
        self.control.remove_files()
        self.trace.close()
        if self.metrics is not None:
            await self.metrics.close()
        # 3. whatever a killed child left behind
        leftovers = remove_segments(self.shm_prefix)
        if leftovers:
            log.warning("removed %d shared-memory segment(s) left by dead processes",
                        len(leftovers))
        self.timer.close()
        self.inbox.close()
        self.done_inbox.close()
        self._dump_wakes()
        self.outbox.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        log.info("server stopped")
