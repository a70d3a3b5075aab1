"""Triton's dynamic batch scheduler, which is also its default scheduler.

With `dynamic_batching` (and max_batch_size > 0) the DynamicBatcher decides which
queued requests go together; without it every request runs alone, oldest first. The
RateLimiter decides which instance runs a batch and when: a batch is cut only once an
instance is granted, so batches keep growing while every instance is busy.
"""

from __future__ import annotations

import collections
import itertools
import logging
from typing import Callable, Hashable

from scheduler.scheduling.batcher import (DefaultBatcher, DynamicBatcher, QueueFull,
                                          QueuePolicy, waiting_since)
from scheduler.scheduling.delay_hooks import SchedulerHold
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.scheduling.ordering import ResponseOrder
from scheduler.scheduling.interface import Callbacks
from scheduler.scheduling.queued import Queued
from scheduler.stats import CANCELED, OTHER, REJECTED, ModelStats
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.messages.leases import LEASE_DEPTH, goes_direct
from shm.messages.worker import BatchDone, ExecuteBatch

log = logging.getLogger("shmserve.scheduler")

_batch_ids = itertools.count(1)
_lease_ids = itertools.count(1)
# A frontend is lent an instance after this many of its requests in a row found the
# model idle (nothing queued, nothing running, no lease out): one client at c=1, or a
# few taking turns, not many at once. For the one instance of a model that runs every
# request alone (a deep lease, `_deep`), after this many in a row from that frontend,
# whatever they found: nothing is batched, so its clients may overlap
LEASE_AFTER = 16
LINGER = 4096  # decoupled requests remembered after their batch, for cancels


def make_batcher(config, environ=None):
    if config.HasField("dynamic_batching") and config.max_batch_size > 0:
        db = config.dynamic_batching
        return DynamicBatcher(
            config.max_batch_size,
            list(db.preferred_batch_size) or [config.max_batch_size],
            db.max_queue_delay_microseconds * 1000,
            preserve_ordering=db.preserve_ordering,
            priority_levels=db.priority_levels,
            default_priority_level=db.default_priority_level,
            default_policy=QueuePolicy.from_config(db.default_queue_policy),
            level_policies={level: QueuePolicy.from_config(p)
                            for level, p in db.priority_queue_policy.items()},
            # Triton's dynamic batcher reads only TRITONSERVER_DELAY_SCHEDULER; the
            # backlog hook belongs to the sequence batcher
            hold_until=SchedulerHold.from_env(environ).queued,
        )
    return DefaultBatcher()


def shape_key(config) -> Callable[[Queued], Hashable]:
    """What requests must share to batch: the shapes of non-ragged inputs (and, where
    inputs are optional, which inputs they carry). A closure: it runs per request."""
    if config.max_batch_size <= 0:
        return lambda q: None
    # inputs allowed to differ in shape within a batch
    ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
    # with optional inputs, only requests carrying the same inputs batch together
    optional = any(i.optional for i in config.input)

    def key(q: Queued) -> Hashable:
        inputs = q.req.inputs
        if len(inputs) == 1 and not optional:  # the usual request: the same key,
            t = inputs[0]  # without a generator and a sort
            return () if t.name in ragged else ((t.name, tuple(t.shape[1:])),)
        # sorted: the order a client lists its inputs in does not matter
        k = tuple(sorted((t.name, tuple(t.shape[1:])) for t in inputs
                         if t.name not in ragged))
        return (k, frozenset(t.name for t in inputs)) if optional else k
    return key


def log_prefix(req: InferRequest) -> str:
    """Triton's InferenceRequest::LogRequest(), as its errors start (2.51 says
    `[request id: <id_unknown>] Exceeds maximum queue size` for a request with no id)."""
    return f"[request id: {req.request_id or '<id_unknown>'}] "


class DynamicBatchScheduler:
    """Requests of one model version in, ExecuteBatch messages to granted instances out
    (an InstanceScheduler, scheduling/interface.py)."""

    def __init__(self, name: str, version: int, config, rate_limiter: RateLimiter,
                 callbacks: Callbacks, *, histograms: bool = True,
                 environ: dict | None = None, batcher=None, ordered: bool | None = None):
        """`batcher` and `ordered` (preserve_ordering) are given by a scheduler that
        holds this one to form its own batches (the sequence batch scheduler); by
        default they come from `dynamic_batching`."""
        self.name = name
        self.version = version
        self.config = config
        self.batcher = make_batcher(config, environ) if batcher is None else batcher
        self.batching = config.max_batch_size > 0
        self.shape_key = shape_key(config)
        self.rate_limiter = rate_limiter
        self._callbacks = callbacks
        self._send_batch = callbacks.send_batch
        self._fail = callbacks.fail
        self._pump_soon = callbacks.pump_soon
        # preserve_ordering: workers relay responses here, released in request order
        if ordered is None:
            ordered = (config.HasField("dynamic_batching")
                       and config.dynamic_batching.preserve_ordering)
        self.order: ResponseOrder | None = ResponseOrder() if ordered else None
        self.stats = ModelStats(name, version, histograms)
        self.in_flight: dict[int, tuple[InstanceSlot, list[Queued]]] = {}
        self.accepting = True
        # bytes copied by instance ([host, h2d, d2h, d2d], as workers report them)
        self.copies: dict[str, list[int]] = {}
        # decoupled requests may keep responding after their batch is done: the worker
        # that ran each of the last LINGER ones, so a cancel still reaches it
        self.decoupled = config.model_transaction_policy.decoupled
        # a decoupled batch's BatchDone routes the cancels of requests still answering
        self.quiet_done = not self.decoupled
        self.lingering: collections.OrderedDict[tuple[str, int], str] = \
            collections.OrderedDict()
        # A batch that cannot grow may wait at a busy instance's worker, one batch each,
        # so the instance starts it the moment its running one ends: a request that runs
        # alone (Triton's default scheduler), or a full dynamic batch where the instance,
        # once free, would get the same one (DynamicBatcher.cuts_ahead). Not for
        # decoupled models (their batches end while they still answer) or relayed
        # responses (preserve_ordering).
        self.queue_at_instances = (batcher is None and self.batcher.cuts_ahead
                                   and not self.decoupled and self.order is None)
        # An idle instance may be lent to a frontend whose requests come one at a time
        # (shm/messages/leases.py): on the same terms, and never under the rate
        # limiter, which must see every execution
        self.leasable = self.queue_at_instances and not rate_limiter.enabled
        self.leases_out = 0
        self._streak_from = ""  # the frontend whose requests found the model idle...
        self._streak = 0  # ...this many times in a row
        self._deep_lease: bool | None = None  # _deep's answer, once asked

    # -- requests ---------------------------------------------------------------------

    def enqueue(self, q: Queued, now: int) -> None:
        req = q.req
        if not self.accepting:
            raise InferError(ErrorCode.UNAVAILABLE, log_prefix(req) + (
                "Server is stopping, scheduler for model has stopped accepting new "
                "inference requests"))
        q.queue_ns = now
        if self.leases_out and self._forward(q):
            return
        try:
            self.batcher.enqueue(q, batch_size=req.batch_size if self.batching else 1,
                                 shape_key=self.shape_key(q), now=waiting_since(q),
                                 priority=req.priority, timeout_ns=req.timeout_us * 1000)
        except QueueFull as exc:
            raise InferError(ErrorCode.UNAVAILABLE, log_prefix(req) + str(exc)) from None
        if self.leasable:
            self._lease_terms(q)
        self._pump_soon(self)

    def _deep(self) -> bool:
        """Whether this model's lease is deep (shm/messages/leases.py): every request
        runs alone (no dynamic batcher) on its one instance, so a frontend's requests
        may overlap under it without costing a batch or another instance's turn. Asked
        once: a version's instances are all there before its first request."""
        deep = self._deep_lease
        if deep is None:
            deep = self._deep_lease = type(self.batcher) is DefaultBatcher and len(
                self.rate_limiter.slots(self)) == 1
        return deep

    def _forward(self, q: Queued) -> bool:
        """A request from the frontend that holds the deep lease, which sent it here
        (it had not heard of the lease yet, or had its depth out): sent on to the
        worker under the lease, as the frontend would, rather than taking the lease
        back; up to LEASE_DEPTH at once, past which the lease ends and they queue here
        (a client that floods its frontend does not fill the worker's inbox). Its
        client regions are the lease's to keep (RegionRegistry.unregister waits for the
        lease's end), its statistics come as the frontend's do, and until its batch
        ends it counts as pending (one of those at the worker runs: see
        waiting_at_instances)."""
        req = q.req
        if q.trace_id or not goes_direct(req):
            return False
        for slot in self.rate_limiter.slots(self):
            if slot.lease and slot.lessee == req.reply_to and not slot.lease_ending \
                    and len(slot.forwarded) < LEASE_DEPTH and self._deep():
                slot.forwarded.add(req.id)
                self._callbacks.send_direct(slot, q)
                return True
        return False

    def _lease_terms(self, q: Queued) -> None:
        """Count the requests in a row from one frontend that found the model idle (for
        a deep lease, that came from it). Any other request that comes here while an
        instance is lent takes the leases back: the frontend that holds one sends here
        only what it cannot send under it (`_forward` takes those of a deep lease), and
        another frontend's requests may need the instance, or be batched with it."""
        if self.leases_out:
            self._streak = 0
            self.end_leases()
            return
        req = q.req
        if (len(self.batcher) == 1 and not self.in_flight or self._deep()) \
                and not q.trace_id and goes_direct(req):
            if req.reply_to == self._streak_from:
                self._streak += 1
            else:
                self._streak_from, self._streak = req.reply_to, 1
        else:
            self._streak = 0

    def end_leases(self) -> None:
        for slot in self.rate_limiter.slots(self):
            if slot.lease and not slot.lease_ending:
                slot.lease_ending = True
                self._callbacks.end_lease(slot)

    def lease_queue(self, instance: str, lease: int, waiting: int) -> None:
        for slot in self.rate_limiter.slots(self):
            if slot.key == instance and slot.lease == lease:  # not one over since
                slot.lease_waiting = waiting

    def lease_ended(self, instance: str, lease: int) -> list:
        for slot in self.rate_limiter.slots(self):
            if slot.key == instance and slot.lease == lease:
                self.leases_out -= 1
                return self.rate_limiter.lease_ended(slot, lease)
        return []

    def _lend(self, slot: InstanceSlot, batch: list[Queued], ahead: bool = False) -> dict:
        """The lease to grant with this batch, if its frontend has earned one: the
        batch's lease fields (none, or the lease id and its depth). A deep lease may
        ride on a batch sent to wait at the instance, and only once nothing else waits
        here, since the lent instance takes no batch from this scheduler until its end."""
        if (self._streak < LEASE_AFTER or len(batch) != 1
                or batch[0].req.reply_to != self._streak_from):
            return {}
        deep = self._deep()
        if (deep and len(self.batcher)) or (ahead and not deep) \
                or not self._callbacks.may_lend(slot):
            return {}
        self._streak = 0
        self.leases_out += 1
        slot.lease, slot.lessee = next(_lease_ids), self._streak_from
        return {"lease": slot.lease, "lease_depth": LEASE_DEPTH if deep else 0}

    def pump(self, now: int) -> None:
        batcher = self.batcher
        for q in batcher.expired(now):
            self.stats.failed(q, REJECTED, now)
            self._fail(q, ErrorCode.UNAVAILABLE, "Request timeout expired")
        limiter = self.rate_limiter
        while len(batcher):
            slot = limiter.acquire(self)
            if slot is None:
                break
            batch = batcher.next_batch(now)
            if not batch:
                limiter.unused(slot)
                break
            self.dispatch(slot, batch, **self._lend(slot, batch))
        if self.queue_at_instances:
            while len(batcher):
                slot = limiter.queue_at(self)
                if slot is None:
                    break
                batch = batcher.complete_batch(now)
                if not batch:
                    break
                self.dispatch(slot, batch, ahead=True, **self._lend(slot, batch, True))

    def dispatch(self, slot: InstanceSlot, requests: list[Queued], ahead: bool = False,
                 **fields) -> int:
        """Send a batch to the granted instance `slot` (`ahead`: to wait behind the batch
        it runs); returns its batch id. `fields` are the ExecuteBatch's own (a sequence
        batch's slots). The worker gets the requests as their requesters sent them,
        none of the scheduler's stamps."""
        batch_id = next(_batch_ids)
        if ahead:
            self.rate_limiter.queued(slot, batch_id)
        else:
            self.rate_limiter.started(slot, batch_id)
        self.in_flight[batch_id] = (slot, requests)
        if self.order is not None:
            self.order.dispatched(batch_id, requests)
        self._send_batch(slot, ExecuteBatch(batch_id, slot.key, [q.req for q in requests],
                                            relay=self.order is not None, ahead=ahead,
                                            **fields),
                         requests)
        return batch_id

    def next_deadline(self) -> int | None:
        # a partial batch's delay matters only if an instance could take it when it
        # expires; until one can, the batch that frees it wakes this scheduler
        return self.batcher.next_deadline(self.rate_limiter.available(self))

    def batch_done(self, msg: BatchDone, now: int):
        if msg.direct:  # sent by a frontend under its lease
            self._direct_ran(msg, now)
            return [], []
        entry = self.in_flight.pop(msg.batch_id, None)
        if entry is None:
            return [], []  # its instance was declared lost already
        slot, requests = entry
        if self.decoupled and slot.worker is not None:
            self._linger(requests, slot.worker.address)
        woken = self.rate_limiter.finished(slot, msg.batch_id)
        if msg.copies:
            self.copies[msg.instance] = msg.copies
        ran, failed = requests, msg.failed
        if msg.cancelled:  # taken out while they waited at the worker: never run
            out, was_failed = set(msg.cancelled), set(failed)
            ran, failed = [], []  # indices into what ran, not the batch as sent
            for i, q in enumerate(requests):
                if i in out:
                    self.stats.failed(q, CANCELED, now)
                    continue
                if i in was_failed:
                    failed.append(len(ran))
                ran.append(q)
        if ran:
            sizes = ([q.req.batch_size for q in ran] if self.batching else [1] * len(ran))
            self.stats.batch_ran(ran, failed, sizes, sum(sizes), msg.compute_start_ns,
                                 msg.input_end_ns, msg.output_start_ns, msg.compute_end_ns)
        if self.order is not None:
            results = msg.responses
            if len(results) != len(requests):  # a worker that did not relay: say so
                results = [(ErrorCode.INTERNAL, "instance returned no response")] * len(requests)
            self._release(self.order.done(msg.batch_id, results))
        return requests, woken

    def _direct_ran(self, msg: BatchDone, now: int) -> None:
        """Statistics of a batch a frontend sent under its lease: its queue time runs
        from the request's start in the frontend to the batch's start. A request
        cancelled while it waited at the worker (a deep lease's) never ran."""
        if msg.copies:
            self.copies[msg.instance] = msg.copies
        for slot in self.rate_limiter.slots(self):  # one this scheduler sent on, maybe
            if slot.forwarded and slot.key == msg.instance:
                slot.forwarded.discard(msg.batch_id)  # a direct batch's id: its request's
        ran = [Queued(InferRequest(0, "", self.name, self.version, [], start_ns=start,
                                   batch_size=size), queue_ns=start)
               for start, size in msg.direct]
        if msg.cancelled:
            out = set(msg.cancelled)
            for i in out:
                self.stats.failed(ran[i], CANCELED, now)
            ran = [q for i, q in enumerate(ran) if i not in out]
            if not ran:
                return
        sizes = [q.req.batch_size for q in ran] if self.batching else [1] * len(ran)
        self.stats.batch_ran(ran, msg.failed, sizes, sum(sizes), msg.compute_start_ns,
                             msg.input_end_ns, msg.output_start_ns, msg.compute_end_ns)

    def _release(self, pairs) -> None:
        """Hand on what preserve_ordering let go: relayed responses, or failures
        (code, reason) of batches that never finished."""
        for q, result in pairs:
            if isinstance(result, tuple):
                self._fail(q, *result)
            else:
                self._callbacks.respond(q, result)

    def _fail_dispatched(self, batch_id: int, requests, code: ErrorCode, reason: str,
                         now: int) -> None:
        """Fail a batch that was sent to an instance (in request order, with
        preserve_ordering, so later batches are not held behind it for ever)."""
        for q in requests:
            self.stats.failed(q, OTHER, now)
        if self.order is not None:
            self._release(self.order.done(batch_id, [(code, reason)] * len(requests)))
            return
        for q in requests:
            self._fail(q, code, reason)

    # -- instances ----------------------------------------------------------------------

    def instance_lost(self, slot: InstanceSlot, reason: str, now: int) -> int:
        batches = [b for b in (slot.batch, slot.ahead) if b is not None]
        if slot.lease:  # its frontend fails what it sent under the lease
            self.leases_out -= 1
            self._callbacks.lease_lost(slot, reason)
        self.rate_limiter.lost(slot)
        failed = 0
        for batch in batches:
            _, requests = self.in_flight.pop(batch, (None, []))
            self._fail_dispatched(batch, requests, ErrorCode.UNAVAILABLE, reason, now)
            failed += len(requests)
        return failed

    def instance_back(self, slot: InstanceSlot) -> None:
        self.rate_limiter.back(slot)

    # -- leaving ------------------------------------------------------------------------

    def cancel(self, reply_to: str, request_id: int, now: int) -> bool:
        removed = self.batcher.remove(
            lambda q: q.req.id == request_id and q.req.reply_to == reply_to)
        for q in removed:
            self.stats.failed(q, CANCELED, now)
            self._fail(q, ErrorCode.CANCELLED, "request was cancelled")
        return bool(removed)

    def drop_from(self, reply_to: str, now: int) -> list[Queued]:
        """The frontend `reply_to` died: take its queued requests out, unanswered. Their
        inputs lie in its arena, which is gone, and nobody would read the answer."""
        removed = self.batcher.remove(lambda q: q.req.reply_to == reply_to)
        for q in removed:
            self.stats.failed(q, OTHER, now)
        return removed

    def running(self, slot: InstanceSlot) -> list[Queued]:
        return [q for s, requests in self.in_flight.values() if s is slot
                for q in requests]

    def running_on(self, reply_to: str, request_id: int) -> str | None:
        """The inbox of the worker running request `request_id` of `reply_to` (or,
        for a decoupled model, that ran it lately), None if none is known."""
        for slot, requests in self.in_flight.values():
            for q in requests:
                if q.req.id == request_id and q.req.reply_to == reply_to:
                    return slot.worker.address if slot.worker is not None else None
        return self.lingering.get((reply_to, request_id))

    def request_complete(self, reply_to: str, request_id: int) -> None:
        """A decoupled request sent its final response: cancels cannot matter now."""
        self.lingering.pop((reply_to, request_id), None)

    def _linger(self, requests, address: str) -> None:
        # forgotten when the request completes (ResponseStats); the bound is for
        # requests whose worker died: a request still streaming after this many newer
        # ones is out of reach of a cancel
        lingering = self.lingering
        for q in requests:
            lingering[(q.req.reply_to, q.req.id)] = address
        while len(lingering) > LINGER:
            lingering.popitem(last=False)

    def begin_unload(self) -> None:
        self.accepting = False
        self._callbacks.wake(self)  # what is queued goes on to its instances
        # a lent instance's worker may be stopped (its last instance unloaded): the
        # lease ends first, so what its frontend sends late is handed on, not lost
        self.end_leases()

    @property
    def drained(self) -> bool:
        return not len(self.batcher) and not self.in_flight and not self.leases_out

    @property
    def pending(self) -> int:
        return len(self.batcher)

    @property
    def waiting_at_instances(self) -> int:
        """Requests sent to wait behind a running batch (RateLimiter.queue_at), and
        under a deep lease those its frontend has waiting at the worker behind its
        oldest (LeaseQueue) with those this scheduler sent on: not running yet, so
        Triton's pending count counts them with the queue. (While the frontend has
        none of its own there, one of those sent on runs: counted one too many.)"""
        return sum(1 for _ in self._waiting_at_instances()) + sum(
            slot.lease_waiting + len(slot.forwarded)
            for slot in self.rate_limiter.slots(self))

    def waiting_from(self, reply_to: str) -> int:
        """Of those, the requests of frontend `reply_to` (its workers drop them when
        they hear it is gone, and the batch's end counts them)."""
        return sum(1 for q in self._waiting_at_instances() if q.req.reply_to == reply_to)

    def _waiting_at_instances(self):
        for slot in self.rate_limiter.slots(self):
            entry = self.in_flight.get(slot.ahead) if slot.ahead is not None else None
            if entry is not None:
                yield from entry[1]

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        for q in self.batcher.remove(lambda r: True):
            self.stats.failed(q, OTHER, now)
            self._fail(q, code, reason)
        for batch_id in list(self.in_flight):
            slot, requests = self.in_flight.pop(batch_id)
            slot.batch = slot.ahead = None
            self._fail_dispatched(batch_id, requests, code, reason, now)

    def summary(self) -> str:
        """What ran: requests, batches by size and the bytes workers copied."""
        batches = self.stats.batches
        rows = sum(size * b.count for size, b in batches.items())
        sizes = ", ".join(f"{size}:{b.count}" for size, b in sorted(batches.items()))
        copies = [sum(c[i] for c in self.copies.values()) for i in range(4)]
        return (f"model '{self.name}' version {self.version}: {rows} rows in "
                f"{self.stats.execution_count} batches; batch sizes {{{sizes}}}; bytes "
                f"copied host={copies[0]} h2d={copies[1]} d2h={copies[2]} d2d={copies[3]}")
