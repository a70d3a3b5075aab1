"""Triton's sequence batch scheduler: the `Scheduler` of a model with
`sequence_batching`.

The SequenceBatcher (scheduler/scheduling/sequence_batcher.py) decides which requests
form each instance's next batch and which slot each fills; this class drives it from the
loop: it asks the RateLimiter for the one instance a batch belongs to (a sequence's slot
lives on one instance, so the shared idle list cannot pick any instance), sends
ExecuteBatch with each request's slot and the filler slots, and lets the batcher know
when a batch ran. The worker makes the control tensors and keeps the implicit state
(workers/sequence.py): the scheduler sends no tensor bytes.
"""

from __future__ import annotations

import logging

from scheduler.scheduling.delay_hooks import SchedulerHold
from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler
from scheduler.scheduling.ordering import ResponseOrder
from scheduler.scheduling.rate_limiter import InstanceSlot
from scheduler.scheduling.sequence_batcher import SequenceBatcher
from scheduler.stats import REJECTED
from shm.errors import ErrorCode
from shm.messages.frontend import InferRequest
from shm.messages.worker import BatchDone

log = logging.getLogger("shmserve.scheduler")


def make_sequence_batcher(config, shape_key=None, environ=None) -> SequenceBatcher:
    """The SequenceBatcher a `sequence_batching` config asks for."""
    seq = config.sequence_batching
    oldest = seq.WhichOneof("strategy_choice") == "oldest"
    mbs = config.max_batch_size
    common = dict(max_batch_size=mbs, idle_ns=seq.max_sequence_idle_microseconds * 1000,
                  shape_key=shape_key, hold=SchedulerHold.from_env(environ))
    if oldest:
        o = seq.oldest
        return SequenceBatcher(config.name, oldest=True,
                               # Triton: 0 means max_batch_size (at least 1)
                               slots_per_instance=o.max_candidate_sequences or max(1, mbs),
                               delay_ns=o.max_queue_delay_microseconds * 1000,
                               preferred_batch_sizes=list(o.preferred_batch_size),
                               **common)
    d = seq.direct
    return SequenceBatcher(config.name, slots_per_instance=max(1, mbs),
                           delay_ns=d.max_queue_delay_microseconds * 1000,
                           min_slot_utilization=d.minimum_slot_utilization, **common)


class SequenceBatchScheduler(DynamicBatchScheduler):
    """Requests of one stateful model version in, slot-tagged batches out. What it
    shares with the dynamic scheduler (statistics, failing, cancelling, response
    ordering) it inherits; batch formation and instance choice are its own."""

    def __init__(self, name, version, config, rate_limiter, callbacks, *,
                 histograms=True, environ=None):
        super().__init__(name, version, config, rate_limiter, callbacks,
                         histograms=histograms, environ=environ)
        self.batcher = make_sequence_batcher(config, self.shape_key, environ)
        seq = config.sequence_batching
        self.order = None
        if seq.WhichOneof("strategy_choice") == "oldest" and seq.oldest.preserve_ordering:
            self.order = ResponseOrder()
        self.batch_slots: dict[int, list[int]] = {}  # batch id -> the slots it held

    def _sync_instances(self) -> None:
        # instances join the rate limiter after this scheduler exists
        for slot in self.rate_limiter.slots(self):
            if not slot.passive and slot.key not in self.batcher.instances:
                self.batcher.add_instance(slot.key)

    def enqueue(self, req: InferRequest, now: int) -> None:
        self._sync_instances()
        self.batcher.enqueue(req, now, accepting=self.accepting)
        self._pump_soon(self)

    def pump(self, now: int) -> None:
        batcher = self.batcher
        self._sync_instances()
        for req in batcher.expired(now):
            self.stats.failed(req, REJECTED, now)
            self._fail(req, ErrorCode.UNAVAILABLE,
                       "timeout of the corresponding sequence has been expired")
        for corrid in batcher.reap(now):
            log.debug("model '%s': sequence %s was idle too long; its slot is released",
                      self.name, corrid)
        limiter = self.rate_limiter
        for slot in limiter.slots(self):
            if slot.passive or not slot.alive or slot.batch is not None:
                continue
            if not batcher.has_work(slot.key) or not limiter.acquire_instance(slot):
                continue
            batch = batcher.next_batch(slot.key, now)
            if batch is None or not batch.requests:
                limiter.unused(slot)
                continue
            batch_id = self.dispatch(slot, batch.requests, slots=batch.slots,
                                     fillers=batch.fillers)
            self.batch_slots[batch_id] = batch.slots

    def next_deadline(self) -> int | None:
        limiter = self.rate_limiter
        slots = {s.key: s for s in limiter.slots(self)}

        def can_run(key: str) -> bool:
            slot = slots.get(key)
            return slot is not None and limiter.instance_available(slot)

        return self.batcher.next_deadline(can_run)

    def batch_done(self, msg: BatchDone, now: int):
        entry = self.in_flight.get(msg.batch_id)
        requests, woken = super().batch_done(msg, now)
        if entry is not None:
            self.batcher.batch_done(entry[0].key, self.batch_slots.pop(msg.batch_id, []))
        return requests, woken

    def instance_lost(self, slot: InstanceSlot, reason: str, now: int) -> int:
        batch = slot.batch
        failed = super().instance_lost(slot, reason, now)
        if batch is not None:
            self.batcher.batch_done(slot.key, self.batch_slots.pop(batch, []))
        return failed

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        for batch_id, (slot, _) in list(self.in_flight.items()):
            self.batcher.batch_done(slot.key, self.batch_slots.pop(batch_id, []))
        super().fail_all(code, reason, now)
