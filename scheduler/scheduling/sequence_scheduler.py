"""Triton's sequence batch scheduler: the `InstanceScheduler` of a model with
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
from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler, shape_key
from scheduler.scheduling.interface import Callbacks
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.scheduling.sequence_batcher import SequenceBatcher
from scheduler.stats import REJECTED
from shm.errors import ErrorCode
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


class SequenceBatchScheduler:
    """Requests of one stateful model version in, slot-tagged batches out (an
    InstanceScheduler, scheduling/interface.py). As Triton's oldest strategy holds a
    dynamic batch scheduler rather than being one, this holds a DynamicBatchScheduler
    (`batches`) over its SequenceBatcher for what the two share: the batches in flight,
    response ordering, statistics, and the requests that leave early. Which requests
    form each instance's batch, and on which instance, is its own."""

    quiet_done = False  # its slots and backlog move on BatchDone: read at once

    def __init__(self, name: str, version: int, config, rate_limiter: RateLimiter,
                 callbacks: Callbacks, *, histograms: bool = True,
                 environ: dict | None = None):
        self.name = name
        self.version = version
        self.rate_limiter = rate_limiter
        self._callbacks = callbacks
        self._fail = callbacks.fail
        self._pump_soon = callbacks.pump_soon
        self.batcher = make_sequence_batcher(config, shape_key(config), environ)
        seq = config.sequence_batching
        self.batches = DynamicBatchScheduler(
            name, version, config, rate_limiter, callbacks, histograms=histograms,
            environ=environ, batcher=self.batcher,
            ordered=seq.WhichOneof("strategy_choice") == "oldest"
            and seq.oldest.preserve_ordering)
        self.stats = self.batches.stats
        self.batch_slots: dict[int, list[int]] = {}  # batch id -> the slots it held

    def _sync_instances(self) -> None:
        # instances join the rate limiter after this scheduler exists
        for slot in self.rate_limiter.slots(self):
            if not slot.passive and slot.key not in self.batcher.instances:
                self.batcher.add_instance(slot.key)

    def enqueue(self, q: Queued, now: int) -> None:
        self._sync_instances()
        self.batcher.enqueue(q, now, accepting=self.batches.accepting)
        self._pump_soon(self)

    def pump(self, now: int) -> None:
        batcher = self.batcher
        self._sync_instances()
        for q in batcher.expired(now):
            self.stats.failed(q, REJECTED, now)
            self._fail(q, ErrorCode.UNAVAILABLE,
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
            batch_id = self.batches.dispatch(slot, batch.requests, slots=batch.slots,
                                             fillers=batch.fillers)
            self.batch_slots[batch_id] = batch.slots

    def next_deadline(self) -> int | None:
        limiter = self.rate_limiter
        slots = {s.key: s for s in limiter.slots(self)}

        def can_run(key: str) -> bool:
            slot = slots.get(key)
            return slot is not None and limiter.instance_available(slot)

        return self.batcher.next_deadline(can_run)

    def _slots_free(self, instance: str, batch_id: int) -> None:
        """The batch left its instance: the batcher may fill its slots again."""
        slots = self.batch_slots.pop(batch_id, None)
        if slots is not None:
            self.batcher.batch_done(instance, slots)

    def batch_done(self, msg: BatchDone, now: int):
        requests, woken = self.batches.batch_done(msg, now)
        self._slots_free(msg.instance, msg.batch_id)
        return requests, woken

    def instance_lost(self, slot: InstanceSlot, reason: str, now: int) -> int:
        batch = slot.batch
        failed = self.batches.instance_lost(slot, reason, now)
        if batch is not None:
            self._slots_free(slot.key, batch)
        return failed

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        for batch_id, (slot, _) in list(self.batches.in_flight.items()):
            self._slots_free(slot.key, batch_id)
        self.batches.fail_all(code, reason, now)

    def begin_unload(self) -> None:
        self.batches.accepting = False
        self._callbacks.wake(self)  # what is queued goes on to its instances

    # -- the rest, as the dynamic batch scheduler does it -------------------------------

    @property
    def accepting(self) -> bool:
        return self.batches.accepting

    @property
    def drained(self) -> bool:
        return self.batches.drained

    @property
    def pending(self) -> int:
        return self.batches.pending

    @property
    def waiting_at_instances(self) -> int:
        return self.batches.waiting_at_instances

    def waiting_from(self, reply_to: str) -> int:
        return self.batches.waiting_from(reply_to)

    def instance_back(self, slot: InstanceSlot) -> None:
        self.batches.instance_back(slot)

    def end_leases(self) -> None:
        pass  # a sequence's instances are never lent

    def lease_ended(self, instance: str, lease: int) -> list:
        return self.batches.lease_ended(instance, lease)  # never lent: none ends

    def lease_queue(self, instance: str, lease: int, waiting: int) -> None:
        pass  # never lent

    def cancel(self, reply_to: str, request_id: int, now: int) -> bool:
        return self.batches.cancel(reply_to, request_id, now)

    def drop_from(self, reply_to: str, now: int) -> list[Queued]:
        return self.batches.drop_from(reply_to, now)

    def running(self, slot: InstanceSlot) -> list[Queued]:
        return self.batches.running(slot)

    def running_on(self, reply_to: str, request_id: int) -> str | None:
        return self.batches.running_on(reply_to, request_id)

    def request_complete(self, reply_to: str, request_id: int) -> None:
        self.batches.request_complete(reply_to, request_id)

    def summary(self) -> str:
        return self.batches.summary()
