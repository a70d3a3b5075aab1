"""Triton's sequence batcher as a pure state machine: slots, backlog, candidates.

A stateful model (`sequence_batching`) sees every request of a sequence (one
correlation id, from the request with START to the one with END) on the same instance
and in the same batch slot, so it can keep the sequence's state there. This module
decides, with an injected clock and no I/O, which (instance, slot) a sequence owns,
which sequences wait in the backlog for one, and which requests form each instance's
next batch. It follows Triton core's `src/sequence_batch_scheduler/`:

- slots: `max_batch_size` per instance (1 when 0) with `direct`, and
  `max_candidate_sequences` with `oldest`; a new sequence takes the free slot with
  the lowest index (instances in order on a tie), or waits in a FIFO backlog and takes
  the first slot freed;
- direct: a batch spans slots 0..highest slot with a request ready; the slots between
  with nothing ready are not-ready fillers (`fillers`), so every sequence keeps its row;
  `minimum_slot_utilization` with `max_queue_delay_microseconds` holds a batch back
  until enough slots are ready or the oldest request waited that long;
- oldest: one request per candidate sequence at a time goes to a dynamic batcher of
  the instance (oldest first, preferred sizes, queue delay), so a batch never holds
  two requests of one sequence; the next request of a sequence waits until the
  previous one ran;
- a sequence idle longer than `max_sequence_idle_microseconds` loses its slot
  (Triton's reaper): what it queued still runs, later requests need START again.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import Callable, Hashable

from scheduler.scheduling.batcher import DynamicBatcher, waiting_since
from scheduler.scheduling.delay_hooks import SchedulerHold
from shm.errors import ErrorCode, InferError

log = logging.getLogger("shmserve.scheduler")

# Queued in a slot by the reaper: the sequence there is over once this is reached.
FORCE_END = None


class SeqSlot:
    """One sequence slot of one instance, and the sequence that owns it."""

    __slots__ = ("instance", "index", "order", "corrid", "queue", "in_flight")

    def __init__(self, instance: str, index: int, order: int):
        self.instance = instance
        self.index = index
        self.order = order  # the instance's position, to break ties between instances
        self.corrid: Hashable | None = None  # the sequence that owns it
        self.queue: deque = deque()  # its requests not yet batched (and FORCE_END)
        self.in_flight = False  # oldest: a request of it is batched or running

    def __repr__(self) -> str:
        return f"SeqSlot({self.instance}:{self.index} corrid={self.corrid!r})"


class _Backlog(deque):
    """A backlogged sequence's requests, and when the earliest `timeout` among them
    runs out (0: never): the whole sequence is then rejected, as Triton's reaper does."""

    def __init__(self, items=()):
        super().__init__(items)
        self.expires = 0

    def timeout_from(self, req, now: int) -> None:
        if req.timeout_us:
            when = now + req.timeout_us * 1000
            self.expires = min(self.expires, when) if self.expires else when


class SequenceBatch:
    """What one instance runs: real requests in row order, the slot of each, and
    (direct) the slots whose rows are not-ready fillers. Rows are ordered by slot."""

    __slots__ = ("requests", "slots", "fillers")

    def __init__(self, requests: list, slots: list[int], fillers: list[int]):
        self.requests = requests
        self.slots = slots
        self.fillers = fillers


class SequenceBatcher:
    """Every instance's sequence slots, the backlog and the idle reaper of one model."""

    def __init__(self, model: str, *, oldest: bool = False, slots_per_instance: int = 1,
                 max_batch_size: int = 0, idle_ns: int = 1_000_000_000,
                 delay_ns: int = 0, min_slot_utilization: float = 0.0,
                 preferred_batch_sizes: list[int] | None = None,
                 shape_key: Callable | None = None, hold: SchedulerHold | None = None):
        self.model = model
        self.oldest = oldest
        self.slots_per_instance = max(1, slots_per_instance)
        self.max_batch_size = max_batch_size
        self.idle_ns = idle_ns
        self.delay_ns = delay_ns
        self.min_slot_utilization = min_slot_utilization
        self.preferred = list(preferred_batch_sizes or [])
        self.shape_key = shape_key
        self.hold = hold or SchedulerHold()
        self.instances: dict[str, list[SeqSlot]] = {}
        self._free: list[tuple[int, int, str]] = []  # heap: (slot index, order, instance)
        self.assigned: dict[Hashable, SeqSlot] = {}  # corrid -> the slot it owns
        self.backlog: deque[_Backlog] = deque()  # sequences waiting for a slot, FIFO
        self._backlog_of: dict[Hashable, _Backlog] = {}  # corrid -> its backlog queue
        self.last_seen: dict[Hashable, int] = {}  # corrid -> its latest request (ns)
        self._next_reap: int | None = None
        self._wait: dict[str, int] = {}  # direct: when a held-back batch must go
        self._dyn: dict[str, DynamicBatcher] = {}  # oldest: each instance's batcher

    # -- instances --------------------------------------------------------------------

    def add_instance(self, key: str) -> None:
        if key in self.instances:
            return
        order = len(self.instances)
        slots = [SeqSlot(key, i, order) for i in range(self.slots_per_instance)]
        self.instances[key] = slots
        for slot in slots:
            heapq.heappush(self._free, (slot.index, order, key))
        if self.oldest:
            self._dyn[key] = DynamicBatcher(max(1, self.max_batch_size), self.preferred,
                                            self.delay_ns)

    # -- requests ---------------------------------------------------------------------

    def enqueue(self, q, now: int, *, accepting: bool = True) -> None:
        """Place a request (a Queued) in its sequence's slot or backlog queue; raises
        Triton's InferError for a request the sequence batcher refuses."""
        req = q.req
        if req.batch_size > 1:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"inference request to model '{self.model}' must specify "
                             "batch-size 1 due to requirements of sequence batcher")
        corrid = req.sequence_id
        if corrid == 0 or corrid == "":
            raise InferError(ErrorCode.INVALID_ARG,
                             f"inference request to model '{self.model}' must specify a "
                             "non-zero or non-empty correlation ID")
        if not accepting and req.sequence_start:
            raise InferError(ErrorCode.UNAVAILABLE,
                             "Server is stopping, scheduler for model has stopped "
                             "accepting new inference requests")
        slot = self.assigned.get(corrid)
        backlog = self._backlog_of.get(corrid) if slot is None else None
        if not req.sequence_start and slot is None and backlog is None:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"inference request for sequence {corrid} to "
                             f"model '{self.model}' must specify the START flag on the "
                             "first request of the sequence")
        self.last_seen[corrid] = now
        if req.sequence_start and (slot is not None or backlog is not None):
            # Triton goes on in the same slot; START resets the state there
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence "
                        "did not end before this sequence start. Previous sequence will "
                        "be terminated early.", corrid, self.model)
        q.queue_ns = now
        if backlog is not None:
            backlog.append(q)
            backlog.timeout_from(req, now)
            if req.sequence_end:
                del self._backlog_of[corrid]
                del self.last_seen[corrid]  # a sequence with its END cannot go idle
            return
        if slot is None:
            slot = self._take_free_slot()
            if slot is None:  # no free slot: a new backlog queue, served FIFO
                queue = _Backlog([q])
                queue.timeout_from(req, now)
                self.backlog.append(queue)
                if not req.sequence_end:
                    self._backlog_of[corrid] = queue
                else:
                    del self.last_seen[corrid]
                return
            slot.corrid = corrid
            self.assigned[corrid] = slot
            self._reap_by(now + self.idle_ns)
        if req.sequence_end:
            del self.assigned[corrid]
            del self.last_seen[corrid]
        slot.queue.append(q)
        if self.oldest:
            self._advance(slot)

    def _take_free_slot(self) -> SeqSlot | None:
        while self._free:
            index, _, key = heapq.heappop(self._free)
            slots = self.instances.get(key)
            if slots is not None:
                return slots[index]
        return None

    def _release(self, slot: SeqSlot) -> None:
        """The slot's sequence is over: the oldest backlogged sequence takes it, or it
        becomes free."""
        slot.corrid = None
        while self.backlog:
            queue = self.backlog.popleft()
            if not queue:
                continue
            last = queue[-1].req
            corrid = last.sequence_id
            slot.corrid = corrid
            if not last.sequence_end:  # the rest of the sequence comes to the slot
                self._backlog_of.pop(corrid, None)
                self.assigned[corrid] = slot
                seen = self.last_seen.get(corrid)
                if seen is not None:
                    self._reap_by(seen + self.idle_ns)
            slot.queue.extend(queue)
            return
        heapq.heappush(self._free, (slot.index, slot.order, slot.instance))

    # -- idle sequences -----------------------------------------------------------------

    def _reap_by(self, when: int) -> None:
        if self._next_reap is None or when < self._next_reap:
            self._next_reap = when

    def reap(self, now: int) -> list[Hashable]:
        """Release the slots of sequences idle for max_sequence_idle_microseconds;
        returns their correlation ids. Their queued requests still run first."""
        if self._next_reap is None or now < self._next_reap:
            return []
        self._next_reap = None
        reaped = []
        for corrid, seen in list(self.last_seen.items()):
            if now - seen < self.idle_ns:
                self._reap_by(seen + self.idle_ns)
                continue
            slot = self.assigned.pop(corrid, None)
            if slot is not None:
                reaped.append(corrid)
                del self.last_seen[corrid]
                slot.queue.append(FORCE_END)
                if self.oldest:
                    self._advance(slot)
            elif corrid not in self._backlog_of:
                del self.last_seen[corrid]  # ended, or released already
            # a backlogged sequence is looked at again once it holds a slot
        return reaped

    def expired(self, now: int) -> list:
        """Backlogged sequences whose request timeout ran out before they got a slot:
        taken out whole, to be failed ("timeout of the corresponding sequence has
        been expired")."""
        out = []
        if not any(q.expires and q.expires <= now for q in self.backlog):
            return out
        kept = deque()
        for queue in self.backlog:
            if queue.expires and queue.expires <= now:
                out.extend(queue)
                corrid = queue[-1].req.sequence_id if queue else None
                if self._backlog_of.get(corrid) is queue:
                    del self._backlog_of[corrid]
            else:
                kept.append(queue)
        self.backlog = kept
        return out

    # -- batches --------------------------------------------------------------------------

    def queued(self) -> int:
        """Requests in the slots' queues (and, oldest, in the instances' batchers)."""
        count = sum(1 for slots in self.instances.values() for s in slots
                    for r in s.queue if r is not FORCE_END)
        return count + sum(len(d) for d in self._dyn.values())

    def backlogged(self) -> int:
        return sum(len(q) for q in self.backlog)

    def __len__(self) -> int:
        return self.queued() + self.backlogged()

    def has_work(self, instance: str) -> bool:
        if self.oldest:
            return bool(len(self._dyn[instance]))
        return any(s.queue for s in self.instances[instance])

    def _held(self) -> bool:
        return self.hold.active and self.hold.holding(self.queued(), self.backlogged())

    def next_batch(self, instance: str, now: int) -> SequenceBatch | None:
        """The batch `instance` (free now) runs next, or None."""
        if self.oldest:
            return self._next_oldest(instance, now)
        return self._next_direct(instance, now)

    def _next_direct(self, instance: str, now: int) -> SequenceBatch | None:
        slots = self.instances[instance]
        for slot in slots:  # sequences the reaper ended give their slot up first
            while slot.queue and slot.queue[0] is FORCE_END:
                slot.queue.popleft()
                self._release(slot)
        self._wait.pop(instance, None)
        if self._held():
            return None
        ready = [s for s in slots if s.queue]
        if not ready:
            return None
        if self.delay_ns and self.min_slot_utilization:
            earliest = min(waiting_since(s.queue[0]) for s in ready)
            if (now - earliest <= self.delay_ns and
                    len(ready) / len(slots) < self.min_slot_utilization):
                self._wait[instance] = earliest + self.delay_ns + 1
                return None
        top = ready[-1].index
        shape_key = self.shape_key
        first_key = shape_key(ready[0].queue[0]) if shape_key else None
        requests, req_slots, fillers = [], [], []
        for slot in slots[:top + 1]:
            # an empty slot, or one whose request cannot share the batch's shapes,
            # gets a not-ready filler row so every other sequence keeps its row
            if not slot.queue or (shape_key and shape_key(slot.queue[0]) != first_key):
                fillers.append(slot.index)
                continue
            q = slot.queue.popleft()
            requests.append(q)
            req_slots.append(slot.index)
            if q.req.sequence_end:
                self._release(slot)
        return SequenceBatch(requests, req_slots, fillers)

    def _advance(self, slot: SeqSlot) -> None:
        """Oldest: hand the slot's next request to its instance's batcher once the
        previous one ran (Triton's CompleteAndNext)."""
        while not slot.in_flight and slot.queue:
            q = slot.queue.popleft()
            if q is FORCE_END:
                self._release(slot)
                continue
            slot.in_flight = True
            key = self.shape_key(q) if self.shape_key else None
            self._dyn[slot.instance].enqueue((q, slot.index), batch_size=1,
                                              shape_key=key, now=waiting_since(q))
            if q.req.sequence_end:
                # the slot goes to the next sequence now; its first request waits
                # until this one has run (in_flight)
                self._release(slot)

    def _next_oldest(self, instance: str, now: int) -> SequenceBatch | None:
        if self._held():
            return None
        items = self._dyn[instance].next_batch(now)
        if not items:
            return None
        return SequenceBatch([r for r, _ in items], [s for _, s in items], [])

    def batch_done(self, instance: str, slots: list[int]) -> None:
        """The batch that held `slots` of `instance` ran (or failed): with oldest, the
        next request of each of those sequences may go."""
        if not self.oldest:
            return
        seq_slots = self.instances.get(instance)
        if seq_slots is None:
            return
        for index in slots:
            slot = seq_slots[index]
            slot.in_flight = False
            self._advance(slot)

    def next_deadline(self, can_run: Callable[[str], bool] = lambda key: True) -> int | None:
        """When something changes by itself: an idle sequence to reap, a held-back
        direct batch, a partial oldest batch's delay (for instances that could run)."""
        times = [t for t in [self._next_reap] if t is not None]
        times.extend(q.expires for q in self.backlog if q.expires)
        times.extend(t for key, t in self._wait.items() if can_run(key))
        if self.oldest:
            for key, dyn in self._dyn.items():
                t = dyn.next_deadline(can_run(key))
                if t is not None:
                    times.append(t)
        return min(times) if times else None

    # -- leaving ----------------------------------------------------------------------

    def remove(self, predicate: Callable[[object], bool]) -> list:
        """Take queued requests out (cancelled, or failed on unload). A removed END
        still ends its sequence, so its slot is not held for ever."""
        removed = []
        for slots in self.instances.values():
            for slot in slots:
                kept = deque()
                for q in slot.queue:
                    if q is not FORCE_END and predicate(q):
                        removed.append(q)
                        if q.req.sequence_end:
                            kept.append(FORCE_END)
                    else:
                        kept.append(q)
                slot.queue = kept
        for queue in self.backlog:
            for q in [r for r in queue if predicate(r)]:
                queue.remove(q)
                removed.append(q)
        for key, dyn in self._dyn.items():
            for q, index in dyn.remove(lambda item: predicate(item[0])):
                removed.append(q)
                self.batch_done(key, [index])
        return removed
