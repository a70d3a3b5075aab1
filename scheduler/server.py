"""The scheduler process's loop: every message in, through one dispatch table.

One asyncio loop. The inbox delivers every message to its owner's handler; after each
burst the model schedulers it touched are pumped once (pumps.py), so requests that
arrive together are batched together, and a precise timer wakes the loop for the
earliest batching deadline. Most batches end in a quiet inbox (callbacks.send_batch):
their BatchDone wakes the loop only while a request waits for an instance; otherwise it
is read first thing on the next wake, so at c=1 the scheduler wakes once per request,
not twice, and the next request goes to the instance that just ran.

The rooms around the loop: requests.py (admission, cache, cancels, a batch's end),
callbacks.py (what schedulers ask of the process), processes/events.py (children that
come and go), the model manager and control (repository/), the pools (processes/), the
region registry, settings and statistics calls (settings.py).
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

from scheduler.callbacks import LoopCallbacks
from scheduler.cache import ResponseCache
from scheduler.metrics import MetricsServer, start_metrics
from scheduler.processes import leftovers
from scheduler.processes.events import ChildEvents
from scheduler.processes.frontend_pool import FrontendPool, PortInUse
from scheduler.processes.supervisor import Child
from scheduler.processes.worker_pool import WorkerPool
from scheduler.regions import RegionRegistry
from scheduler.repository.control import ModelControl
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.pumps import Pumps
from scheduler.requests import RequestCalls
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.settings import SettingsCalls
from scheduler.timer import PreciseTimer
from scheduler.trace import TraceManager
from shm import devices
from shm.arena import remove_segments
from shm.channel import ipc_address
from shm.errors import ErrorCode
from shm.messages.frontend import (CacheInsert, CancelRequest, FrontendReady,
                                   FrontendStopped, InferRequest, StatsRequest)
from shm.messages.leases import LeaseEnded, LeaseQueue
from shm.messages.regions import RegionRequest
from shm.messages.repository import RepositoryRequest
from shm.messages.results import InferResponse, ReleaseBlocks
from shm.messages.scheduler import SCHEDULER_INBOX
from shm.messages.settings import LogSettingsRequest, TraceSettingRequest
from shm.messages.worker import (BatchDone, InstanceLoaded, ResponseStats, WorkerReady,
                                 done_address)
from shm.transport import SOCKETS, Transport

log = logging.getLogger("shmserve.scheduler")
# while an instance is lent, how often the loop reads the quiet inbox for the ends of
# batches sent under the lease when nothing else wakes it (their statistics)
LEASE_READ_S = 0.1
# the least time workers get to finalize their models at a stop, when the frontends'
# drain used up the exit timeout
WORKER_STOP_MIN_S = 1.0


class Server:
    """`transport` makes the channels (Unix sockets; shm/transport.py's MemoryHub in
    loop tests), `launcher` starts the children (scheduler/processes/supervisor.py's
    Child, or an in-process fake), `timer` wakes the loop at a batching deadline
    (PreciseTimer, or one a test fires), `clock` is every `now` the loop gives its
    schedulers (CLOCK_MONOTONIC ns, the clock PreciseTimer and the workers use; a
    test's clock moves only when the test says)."""

    def __init__(self, args, transport: Transport = SOCKETS, launcher=Child,
                 timer=PreciseTimer, clock=time.monotonic_ns):
        self.args = args
        self.loop = asyncio.get_running_loop()
        # Everything this server puts in /dev/shm starts with this prefix; the root
        # process (scheduler/processes/root.py) chooses it, and the socket directory, so
        # that it can clean up after a scheduler that was killed.
        self.shm_prefix = getattr(args, "shm_prefix", "") or \
            f"shmserve-{os.getpid():x}{secrets.token_hex(2)}-"
        self.run_dir = getattr(args, "run_dir", "") or tempfile.mkdtemp(prefix="shmserve-")
        # held while this process lives: a server killed whole is swept by the next
        self._run_lock = leftovers.hold_run_dir(self.run_dir, self.shm_prefix)
        self.address = ipc_address(self.run_dir, "scheduler")
        self.inbox = transport.inbox(self.address, SCHEDULER_INBOX)
        # BatchDone of quiet batches (callbacks.send_batch): watched only while it matters
        self.done_inbox = transport.inbox(done_address(self.address),
                                          (BatchDone, LeaseQueue))
        self._drained = False  # the quiet inbox was read in this burst
        self._lease_reads: asyncio.TimerHandle | None = None
        self._lease_quiet = False  # the last read found no batch sent under a lease
        # SHMSERVE_WAKE_COUNTS=PATH: what woke this loop, as JSON at exit (tests, tools)
        self.wakes: collections.Counter = collections.Counter()
        self.outbox = transport.outbox(self.loop)
        self.stop_requested = asyncio.Event()
        self.metrics: MetricsServer | None = None
        self.pumps = Pumps(timer(self.loop, self._on_timer), clock)
        self.gpus = devices.gpu_count()  # SHMSERVE_FAKE_GPUS injects a count
        self.regions = RegionRegistry(args.allow_client_shm, self.gpus,
                                      lambda region: self.events.region_gone(region),
                                      send=self.outbox.send)
        # frontends resolve region names for requests they send under a lease
        self.regions.publish = lambda msg: self.frontends.broadcast(msg)
        self.regions.leases = lambda: [s.lease for s in self.callbacks.lent_slots if s.lease]
        self.regions.end_leases = lambda: [
            sched.end_leases() for sched in self.manager.instance_schedulers()]
        self.trace = TraceManager(args.trace_config)
        self.rate_limiter = RateLimiter(args.rate_limit == "execution_count",
                                        args.rate_limit_resource)
        self.workers = WorkerPool(args, self.run_dir, self.shm_prefix, self.address,
                                  self.outbox, peers=lambda: self.frontends.addresses(),
                                  on_instances_lost=self._instances_lost, launcher=launcher)
        self.frontends = FrontendPool(
            args, self.run_dir, self.shm_prefix, self.address, self.outbox,
            self.workers.restarts, on_gone=lambda msg: self.events.frontend_gone(msg),
            on_ready=lambda fe: self.events.frontend_ready(fe), launcher=launcher)
        # what schedulers ask of this process, ensemble steps included
        self.callbacks = LoopCallbacks(self.loop, self.address, self.outbox, self.workers,
                                       self.trace, self.regions, self.pumps.dirty,
                                       self._after_burst, lambda msg: requests.on_cancel(msg),
                                       clock)
        self.manager = ModelRepositoryManager(
            args, self.workers, self.rate_limiter, self.gpus,
            publish=self.frontends.broadcast, callbacks=self.callbacks)
        self.callbacks.models = self.manager.models
        self.callbacks.wakes = self.wakes
        self.callbacks.by_instance = self.manager.by_instance
        self._quiet = self.callbacks.quiet  # quiet batches whose BatchDone is not read yet
        self._lent = self.callbacks.lent_slots  # instances lent to frontends
        self.events = ChildEvents(self.manager, self.workers, self.regions, self.callbacks,
                                  self.outbox, args.strict_readiness)
        cache = ResponseCache(args.cache_bytes) if args.cache_bytes > 0 else None
        self.requests = requests = RequestCalls(self.manager, self.callbacks, self.regions,
                                                self.trace, cache, self.outbox, self.pumps.dirty,
                                                self.wakes, clock)
        self.control = ModelControl(self.manager, args, send=self.outbox.send)
        settings = SettingsCalls(args, self.trace, self.manager, self.outbox.send,
                                 (self.frontends.broadcast, self.workers.broadcast))
        self.handlers = {
            InferRequest: requests.on_infer,
            CancelRequest: requests.on_cancel,
            BatchDone: requests.on_batch_done,
            LeaseEnded: requests.on_lease_ended,
            ResponseStats: requests.on_response_stats,
            CacheInsert: requests.on_cache_insert,
            FrontendReady: self.frontends.on_frontend_ready,
            FrontendStopped: self.frontends.on_frontend_stopped,
            WorkerReady: self.workers.on_worker_ready,
            InstanceLoaded: self.workers.on_instance_loaded,
            InferResponse: self.callbacks.on_response,
            ReleaseBlocks: self.callbacks.on_release,
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
        # the batch ends that came since this loop last looked are read first: a call
        # (statistics, in-flight batches) counts every batch that ended, and a request
        # finds the instance that just ran idle again, so it runs there (warm,
        # rate_limiter.release) rather than waking the other one
        self._drain_done()
        self.handlers[type(msg)](msg)

    def _dispatch_done(self, msg: BatchDone | LeaseQueue) -> None:
        if type(msg) is LeaseQueue:  # a deep lease's frontend: what waits at the worker
            self.requests.on_lease_queue(msg)
            return
        self.outbox.cork()
        self.wakes["quiet BatchDone"] += 1
        if msg.direct:
            self._lease_quiet = False
        self.requests.on_batch_done(msg)

    def _after_quiet_burst(self) -> None:
        self.wakes["quiet inbox wake"] += 1
        self._after_burst()

    def _drain_done(self) -> None:
        """Read the quiet BatchDones not read yet, once per burst."""
        if (self._quiet or self._lent) and not self._drained:
            self._drained = True
            self.done_inbox.drain()

    def _after_burst(self) -> None:
        try:
            self.pumps.run_dirty()
        finally:
            self.outbox.uncork()
        self._drained = False
        if self._lent and self._lease_reads is None and not self._lease_quiet:
            self._lease_reads = self.loop.call_later(LEASE_READ_S, self._read_leased)
        self._watch_done()

    def _read_leased(self) -> None:
        """While instances are lent, the ends of batches their frontends send reach
        the quiet inbox and wake nobody: read them now and then, so statistics and
        metrics stay current and the inbox never fills. A read that finds none stops
        the reads; the next such end then wakes the loop (_watch_done), which starts
        them again, so an idle server with a lease out sleeps."""
        self._lease_reads = None
        self._lease_quiet = True
        self._settle()
    def _watch_done(self) -> None:
        """Wake for quiet BatchDones only while something waits on one: requests
        queued, a version draining, an unregistered region's last users, the server
        stopping. Otherwise the next wake reads them."""
        self.done_inbox.watch(self.pumps.any_waiting() or bool(self.manager.retiring)
                              or bool(self.regions.draining) or self.manager.stopping
                              or (bool(self._lent) and self._lease_reads is None))

    def _on_timer(self) -> None:
        self.outbox.cork()
        self.wakes["timer"] += 1
        self._drain_done()  # what the batch ends free takes the due batches
        try:
            self.pumps.run_due()
        finally:
            self.outbox.uncork()
        self._after_burst()

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
                self.metrics = await start_metrics(self.args, self.manager, self.gpus,
                                                   self._settle)
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

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stopping: draining in-flight requests (up to %.0fs)",
                     self.args.exit_timeout_secs)
            self.stop_requested.set()

    def _instances_lost(self, slots: list[InstanceSlot], how: str) -> None:
        drained = bool(self._quiet)
        if drained:  # batches that finished before the worker died are not lost
            self.done_inbox.drain()
            self._quiet.difference_update(b for slot in slots for b in (slot.batch, slot.ahead))
        self.events.instances_lost(slots, how)
        if drained:
            self._after_burst()  # send what the drain answered; pump what it freed

    def _settle(self) -> None:
        """Read the quiet BatchDones that came, outside a burst (a metrics scrape, the
        shutdown), and send what that frees."""
        if self._quiet or self._lent:
            self.done_inbox.drain()
            self._after_burst()

    def _dump_wakes(self) -> None:
        path = os.environ.get("SHMSERVE_WAKE_COUNTS")
        if path:
            with open(path, "wb") as f:
                f.write(orjson.dumps(dict(self.wakes)))

    # -- shutdown -----------------------------------------------------------------------

    async def shutdown(self) -> None:
        self.manager.stopping = self.outbox.stopping = True
        self.done_inbox.watch(True)  # whatever still runs ends promptly
        await self.control.stop_polling()  # nothing loads while we stop
        # the whole stop fits --exit-timeout-secs (and small margins), as Triton's
        deadline = time.monotonic() + self.args.exit_timeout_secs
        # 1. frontends stop taking requests and finish those in flight, which still
        #    run: queued requests are batched and executed meanwhile
        await self.frontends.drain(self.args.exit_timeout_secs)
        # 2. workers finalize their models and free their arenas
        self._settle()  # what ran is counted, not failed
        now = self.callbacks.clock()
        for sched in self.manager.schedulers():
            if sched.stats.execution_count:
                log.info("%s", sched.summary())
            sched.fail_all(ErrorCode.UNAVAILABLE, "server is stopping", now)
        if self.callbacks.lent:
            log.warning("%d ensemble output block(s) were never released by their clients",
                        len(self.callbacks.lent))
        # what the timeout left, and a moment for finalize() even when none is left
        await self.workers.stop_all(max(deadline - time.monotonic(), WORKER_STOP_MIN_S))
        self.control.remove_files()
        self.trace.close()
        if self.metrics is not None:
            await self.metrics.close()
        # 3. whatever a killed child left behind
        leftovers = remove_segments(self.shm_prefix)
        if leftovers:
            log.warning("removed %d shared-memory segment(s) left by dead processes",
                        len(leftovers))
        self.pumps.timer.close()
        if self._lease_reads is not None:
            self._lease_reads.cancel()
        self.inbox.close()
        self.done_inbox.close()
        self._dump_wakes()
        self.outbox.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.close(self._run_lock)
        log.info("server stopped")
