"""One model version's queue and instances.

The batcher decides which requests form a batch; this class decides which idle instance
runs it, tracks batches in flight and fails their requests if an instance is lost
(Triton keeps the same split between its dynamic batcher and its rate limiter).
"""

from __future__ import annotations

import collections
import itertools
from typing import Callable

from scheduler.batcher import DefaultBatcher, DynamicBatcher
from shm.errors import ErrorCode
from shm.messages.frontend import InferRequest
from shm.messages.worker import ExecuteBatch

_batch_ids = itertools.count(1)


class InstanceSlot:
    """An instance as the scheduler sees it: where it runs and whether it is free."""

    __slots__ = ("key", "name", "kind", "device_id", "worker", "alive", "batch")

    def __init__(self, key: str, name: str, kind: str, device_id: int):
        self.key = key
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.worker = None  # the WorkerHandle running it
        self.alive = False
        self.batch: int | None = None


def make_batcher(config):
    if config.HasField("dynamic_batching") and config.max_batch_size > 0:
        db = config.dynamic_batching
        return DynamicBatcher(
            config.max_batch_size,
            list(db.preferred_batch_size) or [config.max_batch_size],
            db.max_queue_delay_microseconds * 1000,
            preserve_ordering=db.preserve_ordering,
            priority_levels=db.priority_levels,
            default_priority_level=db.default_priority_level,
            default_timeout_ns=db.default_queue_policy.default_timeout_microseconds * 1000,
            allow_timeout_override=db.default_queue_policy.allow_timeout_override,
        )
    return DefaultBatcher()


class ModelScheduler:
    """Requests of one model version in, ExecuteBatch messages to idle instances out."""

    def __init__(self, name: str, version: int, config,
                 send_batch: Callable[[InstanceSlot, ExecuteBatch], None],
                 fail: Callable[[InferRequest, ErrorCode, str], None]):
        self.name = name
        self.version = version
        self.config = config
        self.batcher = make_batcher(config)
        self.batching = config.max_batch_size > 0
        # inputs allowed to differ in shape within a batch
        self.ragged = {i.name for i in config.input if i.allow_ragged_batch}
        self._send_batch = send_batch
        self._fail = fail
        self.slots: dict[str, InstanceSlot] = {}
        self.idle: collections.deque[InstanceSlot] = collections.deque()
        self.in_flight: dict[int, tuple[InstanceSlot, list[InferRequest]]] = {}
        # batch size (rows) -> batches executed; copies by instance ([host, h2d, d2h,
        # d2h] bytes, as workers report them)
        self.batch_sizes: collections.Counter = collections.Counter()
        self.copies: dict[str, list[int]] = {}

    # -- instances ------------------------------------------------------------------

    def add_instance(self, slot: InstanceSlot) -> None:
        self.slots[slot.key] = slot
        slot.alive = True
        slot.batch = None
        self.idle.append(slot)

    def instance_lost(self, key: str, reason: str) -> int:
        """An instance's process died: fail what it was running. Returns how many."""
        slot = self.slots.get(key)
        if slot is None:
            return 0
        slot.alive = False
        try:
            self.idle.remove(slot)
        except ValueError:
            pass
        failed = 0
        if slot.batch is not None:
            _, requests = self.in_flight.pop(slot.batch, (None, []))
            for req in requests:
                self._fail(req, ErrorCode.UNAVAILABLE, reason)
                failed += 1
            slot.batch = None
        return failed

    def instance_back(self, key: str) -> None:
        slot = self.slots[key]
        slot.alive = True
        slot.batch = None
        if slot not in self.idle:
            self.idle.append(slot)

    # -- requests -------------------------------------------------------------------

    def shape_key(self, req: InferRequest):
        if not self.batching:
            return None
        ragged = self.ragged
        return tuple((t.name, tuple(t.shape[1:])) for t in req.inputs if t.name not in ragged)

    def enqueue(self, req: InferRequest, now: int) -> None:
        self.batcher.enqueue(req, batch_size=req.batch_size if self.batching else 1,
                             shape_key=self.shape_key(req), now=now,
                             priority=req.priority, timeout_ns=req.timeout_us * 1000)

    def pump(self, now: int) -> int | None:
        """Dispatch what can go now; returns when to call again (None: on an event)."""
        batcher = self.batcher
        for req in batcher.expired(now):
            self._fail(req, ErrorCode.UNAVAILABLE, "Request timeout expired")
        idle = self.idle
        while idle:
            batch = batcher.next_batch(now)
            if not batch:
                break
            slot = idle.popleft()
            batch_id = next(_batch_ids)
            self.batch_sizes[sum(r.batch_size for r in batch) if self.batching
                             else len(batch)] += 1
            slot.batch = batch_id
            self.in_flight[batch_id] = (slot, batch)
            self._send_batch(slot, ExecuteBatch(batch_id, slot.key, batch))
        return batcher.next_deadline()

    def batch_done(self, batch_id: int) -> list[InferRequest]:
        """The batch finished; returns its requests (none if they were failed already)."""
        entry = self.in_flight.pop(batch_id, None)
        if entry is None:
            return []  # its instance was declared lost already
        slot, requests = entry
        slot.batch = None
        if slot.alive:
            # to the back of the line: idle instances take turns, as Triton's do
            self.idle.append(slot)
        return requests

    def cancel(self, reply_to: str, request_id: int) -> bool:
        removed = self.batcher.remove(lambda r: r.id == request_id and r.reply_to == reply_to)
        for req in removed:
            self._fail(req, ErrorCode.CANCELLED, "request was cancelled")
        return bool(removed)

    def fail_all(self, code: ErrorCode, reason: str) -> None:
        for req in self.batcher.remove(lambda r: True):
            self._fail(req, code, reason)
        for batch_id in list(self.in_flight):
            slot, requests = self.in_flight.pop(batch_id)
            slot.batch = None
            for req in requests:
                self._fail(req, code, reason)

    def summary(self) -> str:
        """What ran: requests, batches by size and the bytes workers copied."""
        batches = sum(self.batch_sizes.values())
        rows = sum(size * n for size, n in self.batch_sizes.items())
        sizes = ", ".join(f"{size}:{n}" for size, n in sorted(self.batch_sizes.items()))
        copies = [sum(c[i] for c in self.copies.values()) for i in range(4)]
        return (f"model '{self.name}' version {self.version}: {rows} rows in {batches} "
                f"batches; batch sizes {{{sizes}}}; bytes copied host={copies[0]} "
                f"h2d={copies[1]} d2h={copies[2]} d2d={copies[3]}")

    @property
    def live_instances(self) -> int:
        return sum(1 for s in self.slots.values() if s.alive)
