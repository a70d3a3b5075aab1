"""Which instance runs the next batch, and when: Triton's rate limiter.

Batch formation (which requests go together) is a model scheduler's business; this
module only hands out instances. A model scheduler asks `acquire(owner)` before it
forms a batch, so a batch is cut only when an instance can run it and keeps growing
while every instance is busy, as Triton's batcher waits for a payload slot.

With `--rate-limit=off` (the default) an idle instance of the model is all it takes.
With `--rate-limit=execution_count` an instance must also get every resource its
instance group names (`rate_limiter { resources [...] }`), counted per device, or
server-wide for `global: true` resources. When instances of several models wait for
the same resources, the one with the fewest executions weighted by its group's
`priority` goes first (Triton: `exec_count * max(priority, 1)`, lowest first).

Every model's instances live in this one object, so a batch finishing on one model
hands its resources to another model's waiting scheduler.
"""

from __future__ import annotations

import collections
from typing import Hashable

from shm.errors import ErrorCode, InferError

GLOBAL = -1  # the device key of `global: true` resources
_ANY_DEVICE = -2  # --rate-limit-resource given without a device: every device


class InstanceSlot:
    """An instance as the scheduler sees it: where it runs, whether it is free, and
    what running a batch on it costs in rate-limiter resources."""

    __slots__ = ("key", "name", "kind", "device_id", "worker", "alive", "batch", "ahead",
                 "queueable", "passive", "resources", "priority", "executions", "owner",
                 "lease", "lessee", "lease_ending", "lease_waiting", "forwarded")

    def __init__(self, key: str, name: str, kind: str, device_id: int, *,
                 passive: bool = False, resources: dict | None = None, priority: int = 0):
        self.key = key
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.worker = None  # the WorkerHandle running it
        self.alive = False
        self.batch: int | None = None  # the batch it runs, if any
        # the batch sent to wait at its worker behind `batch` (RateLimiter.queue_at)
        self.ahead: int | None = None
        # its worker may hold a second batch while it runs one (the worker pool says:
        # not while an execute timeout is watched, which starts when a batch is sent)
        self.queueable = False
        self.passive = passive  # loaded, never scheduled
        # (resource name, device key) -> count needed per execution
        self.resources: dict[tuple[str, int], int] = resources or {}
        self.priority = max(priority, 1)
        self.executions = 0
        self.owner: Hashable | None = None  # the model scheduler it serves
        # lent to the frontend `lessee` (shm/messages/leases.py): neither idle nor given
        # batches until its worker says the lease `lease` is over
        self.lease = 0
        self.lessee = ""
        self.lease_ending = False  # EndLease sent
        # requests its lessee has waiting at the worker (a deep lease: LeaseQueue), and
        # those of the lessee's that the scheduler sent on under it, by request id,
        # until their batch ends
        self.lease_waiting = 0
        self.forwarded: set[int] = set()

    def end_lease(self) -> None:
        self.lease, self.lessee, self.lease_ending = 0, "", False
        self.lease_waiting = 0
        self.forwarded.clear()  # ended at the worker, or handed back here as new

    def weight(self) -> int:
        return self.executions * self.priority


def parse_resource(text: str) -> tuple[str, int, int]:
    """`--rate-limit-resource NAME:COUNT[:DEVICE]` -> (name, count, device or any)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else _ANY_DEVICE
        if count < 0 or (len(parts) == 3 and device < 0):
            raise ValueError
    except ValueError:
        raise ValueError(f"--rate-limit-resource option format is "
                         f"'<resource_name>:<count>:<device>' or "
                         f"'<resource_name>:<count>'. Got {text}") from None
    return parts[0], count, device


def group_resources(group, device_id: int) -> dict[tuple[str, int], int]:
    """The resources one instance of a ModelInstanceGroup needs, keyed by device."""
    out: dict[tuple[str, int], int] = {}
    if not group.HasField("rate_limiter"):
        return out
    for res in group.rate_limiter.resources:
        key = (res.name, GLOBAL if getattr(res, "global") else device_id)
        out[key] = out.get(key, 0) + res.count
    return out


class RateLimiter:
    """Every model's instances, and the resources they share."""

    def __init__(self, enabled: bool = False, explicit: list[tuple[str, int, int]] = ()):
        self.enabled = enabled
        self._explicit = list(explicit)
        self._idle: dict[Hashable, collections.deque[InstanceSlot]] = {}
        self._slots: dict[Hashable, list[InstanceSlot]] = {}
        self._max: dict[tuple[str, int], int] = {}  # what each resource may hand out
        self._used: collections.Counter = collections.Counter()
        self._waiting: dict[Hashable, None] = {}  # owners kept waiting, in order

    # -- instances --------------------------------------------------------------------

    def check(self, slots: list[InstanceSlot]) -> None:
        """Raise Triton's error if these instances could never be scheduled under the
        resource counts given on the command line (before they are added)."""
        if not self.enabled:
            return
        needed: dict[tuple[str, int], int] = {}
        for slot in slots:
            for key, count in slot.resources.items():
                needed[key] = max(needed.get(key, 0), count)
        for (name, device), count in needed.items():
            globals_ = {n for (n, d) in self._max if d == GLOBAL}
            locals_ = {n for (n, d) in self._max if d != GLOBAL}
            if (device == GLOBAL and name in locals_) or (device != GLOBAL and name in globals_):
                raise InferError(ErrorCode.INVALID_ARG,
                                 f'Resource "{name}" is present as both global and '
                                 "device-specific resource in the model configuration.")
            limit = self._limit(name, device)
            if limit is not None and limit < count:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f'Resource count for "{name}" is limited to {limit} which '
                                 "will prevent scheduling of one or more model instances, "
                                 f"the minimum required count is {count}")

    def _limit(self, name: str, device: int) -> int | None:
        """The count given on the command line for a resource (None: not limited there,
        so the largest single need sets it)."""
        if not self._explicit:
            return None
        best = 0  # Triton: a resource the flags do not name is unavailable
        for n, count, d in self._explicit:
            if n == name and (device == GLOBAL or d in (device, _ANY_DEVICE)):
                best = max(best, count)
        return best

    def add(self, owner: Hashable, slot: InstanceSlot) -> None:
        slot.owner = owner
        slot.alive = True
        slot.batch = slot.ahead = None
        self._slots.setdefault(owner, []).append(slot)
        idle = self._idle.setdefault(owner, collections.deque())
        if not slot.passive:
            idle.append(slot)
        for key, count in slot.resources.items():
            limit = self._limit(*key)
            self._max[key] = limit if limit is not None else max(self._max.get(key, 0), count)

    def remove_owner(self, owner: Hashable) -> None:
        """A model version is gone: forget its instances."""
        self._idle.pop(owner, None)
        self._slots.pop(owner, None)
        self._waiting.pop(owner, None)

    def slots(self, owner: Hashable) -> list[InstanceSlot]:
        return self._slots.get(owner, [])

    def lost(self, slot: InstanceSlot) -> None:
        """The instance's process died: it is neither idle nor running any more."""
        if slot.alive and slot.batch is not None:
            self._free(slot)
        slot.alive = False
        slot.batch = slot.ahead = None
        slot.end_lease()
        idle = self._idle.get(slot.owner)
        if idle is not None and slot in idle:
            idle.remove(slot)

    def back(self, slot: InstanceSlot) -> None:
        """A restarted instance can take batches again."""
        slot.alive = True
        slot.batch = slot.ahead = None
        idle = self._idle.get(slot.owner)
        if idle is not None and not slot.passive and slot not in idle:
            idle.append(slot)

    # -- running batches --------------------------------------------------------------

    def acquire(self, owner: Hashable) -> InstanceSlot | None:
        """An instance of `owner` free to run a batch now, with its resources taken;
        None if there is none (the owner is woken by `release` once there may be)."""
        idle = self._idle.get(owner)
        if not idle:
            return None
        if not self.enabled:
            return idle.popleft()
        for slot in sorted(idle, key=InstanceSlot.weight):
            if self._take(slot):
                idle.remove(slot)
                return slot
        self._waiting[owner] = None
        return None

    def acquire_instance(self, slot: InstanceSlot) -> bool:
        """Take this one instance if it is idle and its resources are free: a sequence
        runs on the instance that holds its slot, never on another."""
        idle = self._idle.get(slot.owner)
        if not idle or slot not in idle:
            return False
        if self.enabled and not self._take(slot):
            self._waiting[slot.owner] = None
            return False
        idle.remove(slot)
        return True

    def instance_available(self, slot: InstanceSlot) -> bool:
        """Whether `acquire_instance(slot)` would succeed now (no side effects)."""
        idle = self._idle.get(slot.owner)
        if not idle or slot not in idle:
            return False
        used, limits = self._used, self._max
        return not self.enabled or all(used[k] + c <= limits.get(k, 0)
                                       for k, c in slot.resources.items())

    def available(self, owner: Hashable) -> bool:
        """Whether `acquire(owner)` would grant an instance now (no side effects)."""
        idle = self._idle.get(owner)
        if not idle:
            return False
        if not self.enabled:
            return True
        used, limits = self._used, self._max
        return any(all(used[k] + c <= limits.get(k, 0) for k, c in slot.resources.items())
                   for slot in idle)

    def unused(self, slot: InstanceSlot) -> None:
        """An acquired instance got no batch after all: back to the front of the line."""
        self._free(slot)
        self._idle[slot.owner].appendleft(slot)

    def started(self, slot: InstanceSlot, batch_id: int) -> None:
        slot.batch = batch_id
        slot.executions += 1

    def queue_at(self, owner: Hashable) -> InstanceSlot | None:
        """A running instance of `owner` whose worker may hold the next batch, to start
        it the moment the running one ends, instead of idling while its end reaches
        this process and the next batch comes back; None if none may. Only with the
        rate limiter off: a batch waiting at its instance would hold no resources."""
        if self.enabled:
            return None
        for slot in self._slots.get(owner, ()):
            if (slot.queueable and slot.alive and slot.batch is not None
                    and slot.ahead is None and not slot.lease):
                return slot
        return None

    def queued(self, slot: InstanceSlot, batch_id: int) -> None:
        slot.ahead = batch_id
        slot.executions += 1

    def finished(self, slot: InstanceSlot, batch_id: int) -> list[Hashable]:
        """`batch_id` ended on `slot`. The batch waiting behind it runs now, or the
        instance is released (see `release`). A worker runs an instance's batches in
        the order sent, so the end of the one waiting, read first (its BatchDone came
        through the other inbox), means the running one's end is on its way. Either
        way the owner may send the next batch to wait: it is returned to be pumped."""
        if batch_id == slot.ahead:
            slot.ahead = None
            return [slot.owner]
        if batch_id == slot.batch and slot.ahead is not None:
            slot.batch, slot.ahead = slot.ahead, None
            return [slot.owner]
        if slot.lease:  # lent on: its end releases it (lease_ended)
            slot.batch = None
            return []
        return self.release(slot)

    def lease_ended(self, slot: InstanceSlot, lease: int) -> list[Hashable]:
        """The worker says lease `lease` on `slot` is over: the instance is released,
        unless the batch that granted it has not ended yet (its end then does)."""
        if slot.lease != lease:
            return []
        slot.end_lease()
        if slot.batch is not None or not slot.alive:
            return []
        return self.release(slot)

    def release(self, slot: InstanceSlot) -> list[Hashable]:
        """The instance finished its batch. Returns the owners that may run now: its
        own, and those that were waiting for the resources it gave back, in order of
        their instances' weighted executions."""
        slot.batch = None
        woken = [slot.owner]
        if slot.alive:
            self._free(slot)
            # to the front of the line: the instance that ran last runs next while it
            # is idle, its process awake and its caches warm. At c=1 taking turns cost
            # each worker a cold start per request (issue 23, part 3: worker CPU per
            # request 255 -> 194 us over HTTP on the 2-core VM); under load every
            # instance is busy anyway, and the rate limiter's order is by weight
            if not slot.passive:
                self._idle[slot.owner].appendleft(slot)
        if self._waiting:
            waiting = [o for o in self._waiting if o is not slot.owner]
            self._waiting.clear()
            waiting.sort(key=lambda o: min((s.weight() for s in self._idle.get(o, ())),
                                           default=0))
            woken.extend(waiting)
        return woken

    def _take(self, slot: InstanceSlot) -> bool:
        used, limits = self._used, self._max
        for key, count in slot.resources.items():
            if used[key] + count > limits.get(key, 0):
                return False
        for key, count in slot.resources.items():
            used[key] += count
        return True

    def _free(self, slot: InstanceSlot) -> None:
        if self.enabled:
            for key, count in slot.resources.items():
                self._used[key] -= count

    def resource_use(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(name, device) -> (in use, available): for tests and the log."""
        return {key: (self._used[key], limit) for key, limit in self._max.items()}
