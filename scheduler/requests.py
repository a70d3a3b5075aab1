"""The scheduler's request calls: a request admitted and queued, cancelled, answered
from the response cache, and its batch's end counted.

Admission checks what a frontend cannot: the model's state now, a BLS call's limits
(scheduler/bls.py), the response cache (a hit never enters the queue, as in Triton's
scheduler), trace sampling, and the client regions the request names. Then the model's
scheduler has it. A batch's end frees its instance: the schedulers woken by it are
marked dirty, and the loop pumps them after the burst (scheduler/server.py).
"""

from __future__ import annotations

import collections
import logging

from scheduler import bls
from scheduler.cache import ResponseCache
from scheduler.callbacks import LoopCallbacks, not_ready
from scheduler.regions import RegionRegistry
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.repository.models import ModelReadyState
from scheduler.scheduling.interface import InstanceScheduler
from scheduler.scheduling.queued import Queued
from scheduler.trace import TraceManager
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CacheInsert, CancelRequest, InferRequest, RequestOrigin
from shm.messages.leases import LeaseEnded, LeaseQueue
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone, ResponseStats
from shm.transport import OutboxLike

log = logging.getLogger("shmserve.scheduler")


class RequestCalls:
    """`dirty` is the loop's set of schedulers to pump after this burst; `quiet` the
    quiet batches whose BatchDone is not read yet (callbacks.send_batch)."""

    def __init__(self, manager: ModelRepositoryManager, callbacks: LoopCallbacks,
                 regions: RegionRegistry, trace: TraceManager, cache: ResponseCache | None,
                 outbox: OutboxLike, dirty: set[InstanceScheduler], wakes: collections.Counter,
                 clock):
        self.manager = manager
        self.clock = clock
        self.callbacks = callbacks
        self.regions = regions
        self.trace = trace
        self.cache = cache
        self.outbox = outbox
        self.dirty = dirty
        self.quiet = callbacks.quiet
        self.wakes = wakes

    def on_infer(self, req: InferRequest) -> None:
        self.wakes["InferRequest"] += 1
        mv = self.manager.models.resolve(req.model, req.version)
        if req.origin is RequestOrigin.BLS:  # checked here as a frontend would
            try:
                req = bls.admit(req, mv)
            except InferError as exc:
                self.callbacks.fail(Queued(req), exc.code, bls.refusal(req, exc.message))
                return
        q = Queued(req)  # the scheduler's record of it from here on
        if mv is None or mv.scheduler is None or mv.state is not ModelReadyState.READY:
            self.callbacks.fail(q, ErrorCode.UNAVAILABLE, not_ready(req).message)
            return
        sched = mv.scheduler
        now = self.clock()
        # frontends set a key only for models that cache
        if req.cache_key and self.cache is not None and self._answer_from_cache(q, mv, now):
            return
        if self.trace.active:  # the one check a request pays while tracing is off
            q.trace_id = self.trace.sample(req.model, mv.version, req.request_id)
        try:
            self.regions.resolve(req)  # names of client regions, if the request has any
            sched.enqueue(q, now)
        except InferError as exc:
            self.callbacks.fail(q, exc.code,
                                bls.refusal(req, exc.message)
                                if req.origin is RequestOrigin.BLS else exc.message)

    def _answer_from_cache(self, q: Queued, mv, now: int) -> bool:
        req = q.req
        start = self.clock()
        entry = self.cache.lookup(req.cache_key)
        end = self.clock()
        if entry is None:
            q.cache_lookup_ns = end - start  # counted as cache_miss time if it runs
            return False
        q.queue_ns = now
        self.outbox.send(req.reply_to, InferResponse(req.id, outputs=entry.outputs,
                                                     model_version=mv.version,
                                                     cache_hit=True))
        mv.scheduler.stats.cache_hit(q, start, end, self.clock())
        return True

    def on_cache_insert(self, msg: CacheInsert) -> None:
        if self.cache is None:
            return
        start = self.clock()
        if not self.cache.insert(msg.key, msg.model, msg.version, msg.outputs):
            log.debug("response of '%s' version %d not cached: larger than the cache",
                      msg.model, msg.version)
        insert_ns = self.clock() - start
        mv = self.manager.models.resolve(msg.model, msg.version)
        if mv is not None and mv.scheduler is not None:
            mv.scheduler.stats.cache_inserted(insert_ns)

    def on_cancel(self, msg: CancelRequest) -> None:
        now = self.clock()
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

    def on_lease_ended(self, msg: LeaseEnded) -> None:
        """An instance's worker gave its lease back: the instance takes batches again."""
        sched = self.manager.by_instance.get(msg.instance)
        if sched is None:
            return
        self.dirty.update(sched.lease_ended(msg.instance, msg.lease))
        self.regions.lease_over(msg.lease)  # an unregister may wait for it
        lent = self.callbacks.lent_slots
        lent.difference_update([slot for slot in lent if not slot.lease])

    def on_lease_queue(self, msg: LeaseQueue) -> None:
        """What waits at a worker under a deep lease, from its frontend: pending."""
        sched = self.manager.by_instance.get(msg.instance)
        if sched is not None:
            sched.lease_queue(msg.instance, msg.lease, msg.waiting)

    def on_batch_done(self, msg: BatchDone) -> None:
        self.wakes["BatchDone"] += 1
        if msg.direct:  # its batch id is its frontend's request id, not one of ours
            self.wakes["BatchDone under a lease"] += 1
        else:
            self.quiet.discard(msg.batch_id)
        sched = self.manager.by_instance.get(msg.instance)
        if sched is None:
            return
        now = self.clock()
        requests, woken = sched.batch_done(msg, now)
        callbacks = self.callbacks
        if callbacks.internal:
            callbacks.batch_ran(requests, msg)
        if self.trace.pending or self.regions.users:  # else nothing to record per request
            for q in requests:
                callbacks.request_ended(q, msg, now)
        self.dirty.update(woken)
