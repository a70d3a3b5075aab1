"""What the model schedulers ask of the scheduler process: the loop's `Callbacks`
(scheduling/interface.py), one object given to every scheduler and the model manager.

It sends batches to workers and answers to clients, marks schedulers to be pumped, and
carries the requests this process makes itself (an ensemble's steps): their ids, who
gets their answers, and the output blocks handed on to clients, which come back here
when a client releases them and go on to the workers that own them. `request_ended`
is the one place a request's end is recorded (its trace, the client regions it used).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from typing import Callable

import msgspec

from scheduler import bls
from scheduler.regions import RegionRegistry
from scheduler.repository.models import ModelReadyState, ModelTable
from scheduler.scheduling.interface import InstanceScheduler, RequestOwner
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.rate_limiter import InstanceSlot
from scheduler.trace import TraceManager, request_timestamps
from scheduler.processes.worker_pool import WorkerPool
from shm.channel import Outbox
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest, InferRequest
from shm.messages.leases import EndLease, LeaseEnded
from shm.messages.results import Error, InferResponse, ReleaseBlocks
from shm.messages.worker import BatchDone, ExecuteBatch
from shm.tensor import arena_blocks

log = logging.getLogger("shmserve.scheduler")


def not_ready(req: InferRequest) -> InferError:
    what = f"'{req.model}'" + (f" version {req.version}" if req.version else "")
    return InferError(ErrorCode.UNAVAILABLE, f"model {what} is not ready")


class LoopCallbacks:
    """The scheduler process's side of every scheduler. `dirty` is the loop's set of
    schedulers to pump after the messages at hand; `after_burst` pumps them;
    `cancel_request` is the loop's CancelRequest handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, outbox: Outbox,
                 workers: WorkerPool, trace: TraceManager, regions: RegionRegistry,
                 dirty: set, after_burst: Callable[[], None],
                 cancel_request: Callable[[CancelRequest], None], clock=time.monotonic_ns):
        self.loop = loop
        self.clock = clock  # the loop's: every `now` a scheduler is given
        self.address = address
        self.outbox = outbox
        self.workers = workers
        self.trace = trace
        self.regions = regions
        self.models: ModelTable | None = None  # the manager's, once it exists
        self.by_instance: dict[str, InstanceScheduler] = {}  # the manager's, likewise
        # batches sent quietly whose BatchDone the loop has not read yet: they end in
        # its second inbox, which wakes it only while something waits (server.py)
        self.quiet: set[int] = set()
        self.pump_soon = dirty.add  # the hot path: no frame of its own
        self._dirty = dirty
        self._after_burst = after_burst
        self._cancel_request = cancel_request
        # requests this process makes (ensemble steps): id -> who gets the answers;
        # and blocks it hands on to clients: (segment, offset) -> (owner, reader)
        self._ids = itertools.count(1)
        self.internal: dict[int, RequestOwner] = {}
        self.lent: dict[tuple[str, int], tuple[str, str]] = {}
        # instances lent to frontends (shm/messages/leases.py): while any is, the loop
        # reads the quiet inbox now and then for the batches sent under them
        self.lent_slots: set[InstanceSlot] = set()
        # the loop's counts of what woke it (SHMSERVE_WAKE_COUNTS), and of requests it
        # sent on under a deep lease
        self.wakes: collections.Counter = collections.Counter()

    # -- every scheduler ----------------------------------------------------------------

    def send_batch(self, slot: InstanceSlot, batch: ExecuteBatch,
                   requests: list[Queued]) -> None:
        # Quiet, unless something acts on its BatchDone by itself: responses relayed
        # in it, an ensemble step's timings, a trace, an execute-timeout watch, a
        # decoupled request's cancel routing, a sequence's slots. Client regions do
        # not: their users are counted down when the BatchDone is read, and the one
        # call that waits for that (an unregister) wakes the loop, which reads the
        # ends that came first and watches for the rest (RegionRegistry.draining)
        sched = self.by_instance.get(slot.key)
        if not (batch.relay or self.workers.timeouts.get(slot.key)
                or sched is None or not sched.quiet_done
                # a traced request or an ensemble step can be in the batch only while
                # some are in flight: no walk over the batch otherwise
                or ((self.trace.pending or self.internal) and any(
                    q.trace_id or q.req.reply_to == self.address for q in requests))):
            batch.quiet = True
            self.quiet.add(batch.batch_id)
        self.outbox.send(slot.worker.address, batch)
        self.workers.batch_sent(slot, batch.batch_id)  # the execute-timeout watch
        if batch.lease:
            self.lent_slots.add(slot)

    def may_lend(self, slot: InstanceSlot) -> bool:
        # not while an unregistered region waits for its users: a frontend that has
        # not heard yet would still resolve it
        return (slot.worker is not None and not self.trace.active
                and not self.workers.timeouts.get(slot.key) and not self.regions.draining)

    def send_direct(self, slot: InstanceSlot, q: Queued) -> None:
        # its regions, resolved on arrival, are the lease's to keep from here on
        req = q.req
        self.outbox.send(slot.worker.address, ExecuteBatch(
            req.id, slot.key, [req], quiet=True, lease=slot.lease, direct=True, ahead=True))
        self.regions.finished(req)
        self.wakes["sent on under a lease"] += 1

    def end_lease(self, slot: InstanceSlot) -> None:
        if slot.worker is not None:
            self.outbox.send(slot.worker.address, EndLease(slot.key, slot.lease))

    def lease_lost(self, slot: InstanceSlot, reason: str) -> None:
        self.lent_slots.discard(slot)
        self.regions.lease_over(slot.lease)
        self.outbox.send(slot.lessee, LeaseEnded(slot.key, slot.lease, lost=True,
                                                 reason=reason))

    def fail(self, q: Queued, code: ErrorCode, reason: str) -> None:
        req = q.req
        self.send_response(req.reply_to, InferResponse(req.id, error=Error(code, reason)))
        self.request_ended(q)

    def respond(self, q: Queued, response: InferResponse) -> None:
        # a response its worker relayed through BatchDone (preserve_ordering); the
        # batch's client regions were released when its BatchDone came
        self.send_response(q.req.reply_to, response)

    def wake(self, sched: InstanceScheduler) -> None:
        self._dirty.add(sched)
        self._after_burst()

    def send_response(self, reply_to: str, response: InferResponse) -> None:
        if reply_to == self.address:
            # to a request of this process (an ensemble step): handled on the next turn
            # of the loop, not inside the scheduler pass that produced it
            self.loop.call_soon(self._deliver_internal, response)
        else:
            self.outbox.send(reply_to, response)

    def request_ended(self, q: Queued, done: BatchDone | None = None,
                      now: int = 0) -> None:
        """`q` is answered, failed or dropped: its trace is written, and it no longer
        uses its client regions."""
        if q.trace_id:
            self.trace.complete(q.trace_id,
                                request_timestamps(q, done, now or self.clock()))
        if self.regions.users:
            self.regions.finished(q.req)

    # -- requests of this process's own (ensemble steps) --------------------------------

    def submit(self, owner: RequestOwner, req: InferRequest) -> int:
        request_id = next(self._ids)
        req = msgspec.structs.replace(req, id=request_id, reply_to=self.address)
        if req.callers:  # a step of an ensemble that a python model called
            bls.check_chain(req)
        mv = self.models.resolve(req.model, req.version)
        if mv is None or mv.scheduler is None or mv.state is not ModelReadyState.READY:
            raise not_ready(req)
        now = self.clock()
        mv.scheduler.enqueue(Queued(req), now)
        self.internal[request_id] = owner
        return request_id

    def forget(self, request_id: int) -> None:
        self.internal.pop(request_id, None)

    def cancel(self, request_id: int) -> None:
        self._cancel_request(CancelRequest(request_id, self.address))

    def finish(self, q: Queued, response: InferResponse,
               lent: dict[tuple[str, int], str]) -> None:
        """An ensemble's answer to its client. Its output blocks belong to the workers
        that wrote them; the client releases them here and they are handed on."""
        reply_to = q.req.reply_to
        if lent:
            for block, owner in lent.items():
                self.lent[block] = (owner, reply_to)
            response.owner = self.address
        self.send_response(reply_to, response)
        if response.final:  # else a decoupled ensemble's request goes on
            self.request_ended(q)

    def release(self, owner: str, blocks: list[tuple[str, int]]) -> None:
        if owner == self.address:  # lent by this process: to their real owners
            self.on_release(ReleaseBlocks(self.address, blocks))
            return
        self.outbox.send(owner, ReleaseBlocks(self.address, blocks))

    # -- messages to this process about its own requests --------------------------------

    def on_response(self, msg: InferResponse) -> None:
        """A response to a step request: its ensemble takes it on."""
        owner = self.internal.get(msg.id)
        if owner is None:
            log.warning("response to unknown internal request %d", msg.id)
            blocks = arena_blocks(msg.outputs)
            if blocks and msg.owner:
                self.release(msg.owner, blocks)
            return
        owner.on_response(msg, self.clock())

    def _deliver_internal(self, msg: InferResponse) -> None:
        self.on_response(msg)
        self._after_burst()  # pump the models of the steps it started

    def batch_ran(self, requests: list[Queued], msg: BatchDone) -> None:
        """A batch finished: the steps in it count toward their ensembles' timings."""
        for q in requests:
            req = q.req
            if req.reply_to == self.address:
                owner = self.internal.get(req.id)
                if owner is not None:
                    owner.step_ran(req.id, msg)

    def on_release(self, msg: ReleaseBlocks) -> None:
        """A client is done with ensemble outputs: give each block back to its owner."""
        by_owner: dict[str, list[tuple[str, int]]] = {}
        for segment, offset in msg.blocks:
            owner, _ = self.lent.pop((segment, offset), (None, None))
            if owner is not None:
                by_owner.setdefault(owner, []).append((segment, offset))
        for owner, blocks in by_owner.items():
            self.release(owner, blocks)

    def reader_gone(self, reader: str) -> None:
        """A frontend died: the ensemble outputs it held go back to their owners (it
        will never release them)."""
        held = [block for block, (_, r) in self.lent.items() if r == reader]
        if held:
            self.on_release(ReleaseBlocks(reader, held))
