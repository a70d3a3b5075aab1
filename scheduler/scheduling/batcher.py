"""Batchers: which queued requests form the next batch, and when.

A batcher is a pure state machine driven by an injected clock (integer nanoseconds
passed in by the caller). It has no threads, sleeps, asyncio or I/O: the scheduler's
run loop enqueues requests, asks for a batch whenever a model instance is idle, sleeps
until ``next_deadline()``, and fails what ``expired()`` hands back with a timeout error.
Choosing which instance runs a batch is not the batcher's business.

The rules follow Triton's core (``src/dynamic_batch_scheduler.cc``,
``DynamicBatchScheduler::GetDynamicBatch``; ``src/scheduler_utils.cc``, the
``PriorityQueue``) and the server's ``docs/user_guide/batcher.md``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol

from scheduler.scheduling.delay_hooks import SchedulerHold


def waiting_since(q) -> int:
    """Where a request's batch delay and queue timeout count from: when the frontend
    accepted it (start_ns, CLOCK_MONOTONIC like the scheduler's clock), not its
    enqueue here (Queued.queue_ns). In Triton the queue is entered microseconds after
    parsing, in the same process; here the hop from the frontend takes tens of
    microseconds at rest and more under load, and counting it again as delay only
    added latency (c=1 p50 -50..60 us) and, under load, timer wake-ups (scheduler
    CPU per request -10..15 us at c=16; issue 12's closing note has the A/B). The
    enqueue counts when the frontend gave no time. Statistics count the queue from
    the enqueue."""
    start = q.req.start_ns
    queued = q.queue_ns
    return start if 0 < start <= queued else queued


class Batcher(Protocol):
    """What the scheduler's run loop calls on every per-model batcher."""

    def enqueue(
        self,
        item: Any,
        *,
        batch_size: int,
        shape_key: Hashable,
        now: int,
        priority: int = 0,
        timeout_ns: int = 0,
    ) -> None: ...

    def next_batch(self, now: int) -> list | None: ...

    # may a batch that cannot grow be cut while every instance is busy, and that batch
    cuts_ahead: bool

    def complete_batch(self, now: int) -> list | None: ...

    def next_deadline(self, batching: bool = True) -> int | None: ...

    def expired(self, now: int) -> list: ...

    def remove(self, predicate: Callable[[Any], bool]) -> list: ...

    def __len__(self) -> int: ...


class DefaultBatcher:
    """Triton's default scheduler: requests run one at a time, oldest first.

    Priorities, shapes and queue timeouts play no part: Triton applies queue policies
    only in the dynamic batcher.
    """

    def __init__(self) -> None:
        self._queue: deque = deque()

    def enqueue(
        self,
        item: Any,
        *,
        batch_size: int,
        shape_key: Hashable,
        now: int,
        priority: int = 0,
        timeout_ns: int = 0,
    ) -> None:
        self._queue.append(item)

    def next_batch(self, now: int) -> list | None:
        return [self._queue.popleft()] if self._queue else None

    # a batch of one cannot grow: it may always be cut while the instances are busy
    cuts_ahead = True
    complete_batch = next_batch

    def next_deadline(self, batching: bool = True) -> int | None:
        return None  # only an idle instance changes anything

    def expired(self, now: int) -> list:
        return []

    def remove(self, predicate: Callable[[Any], bool]) -> list:
        kept, removed = deque(), []
        for item in self._queue:
            (removed if predicate(item) else kept).append(item)
        self._queue = kept
        return removed

    def __len__(self) -> int:
        return len(self._queue)


class QueueFull(Exception):
    """The request's priority level holds `max_queue_size` requests already."""


@dataclasses.dataclass(frozen=True)
class QueuePolicy:
    """A priority level's ModelQueuePolicy, times in nanoseconds."""

    timeout_action: str = "REJECT"  # or "DELAY"
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded

    @classmethod
    def from_config(cls, policy) -> "QueuePolicy":
        """From a ModelQueuePolicy message."""
        action = "DELAY" if policy.timeout_action == 1 else "REJECT"
        return cls(action, policy.default_timeout_microseconds * 1000,
                   policy.allow_timeout_override, policy.max_queue_size)


class _Entry:
    """One queued request and what the batcher needs to know about it."""

    __slots__ = ("item", "size", "key", "enqueue_ns", "deadline_ns", "seq", "live", "level")

    def __init__(self, item, size, key, enqueue_ns, deadline_ns, seq, level):
        self.item = item
        self.size = size
        self.key = key
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = deadline_ns  # 0: no queue timeout
        self.seq = seq
        self.live = True  # False once dispatched, expired, delayed or removed
        self.level = level  # index into the batcher's levels


class _Level:
    """One priority level: its policy, its queue, and the requests its DELAY action
    moved behind every unexpired one (Triton's PolicyQueue and its delayed queue)."""

    __slots__ = ("policy", "queue", "delayed", "count")

    def __init__(self, policy: QueuePolicy):
        self.policy = policy
        self.queue: deque[_Entry] = deque()
        self.delayed: deque[_Entry] = deque()
        self.count = 0  # live entries in queue and delayed


class DynamicBatcher:
    """Triton's dynamic batcher (``dynamic_batching { ... }``), times in nanoseconds.

    ``preferred_batch_sizes`` empty means ``[max_batch_size]``, as Triton's config
    normalisation fills it in. ``preserve_ordering`` does not change batching (Triton
    uses it only to order responses); it is kept for the caller.

    Each priority level has its queue policy (``priority_queue_policy``, else
    ``default_queue_policy``): ``max_queue_size`` (``enqueue`` raises QueueFull), a
    queue timeout that a request's own ``timeout`` may shorten when the policy allows
    it, and what a timeout does: REJECT (the request comes back from ``expired()``) or
    DELAY (it stays, behind every unexpired request of its level).

    ``hold_until`` is Triton's TRITONSERVER_DELAY_SCHEDULER test hook: no batch forms
    until that many requests are queued, once.

    Dispatched and expired entries are marked dead rather than searched for, so the
    common path costs O(batch), not O(queue).
    """

    # Rebuild the deques / timeout heap once this many dead entries pile up.
    _COMPACT_SLACK = 64

    def __init__(
        self,
        max_batch_size: int,
        preferred_batch_sizes: list[int],
        max_queue_delay_ns: int,
        *,
        preserve_ordering: bool = False,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        default_timeout_ns: int = 0,
        allow_timeout_override: bool = False,
        default_policy: QueuePolicy | None = None,
        level_policies: dict[int, QueuePolicy] | None = None,
        hold_until: int = 0,
    ) -> None:
        # Triton batches at least one request even for max_batch_size 0.
        self.max_batch_size = max(1, int(max_batch_size))
        preferred = sorted(set(preferred_batch_sizes)) or [self.max_batch_size]
        if any(p < 1 or p > self.max_batch_size for p in preferred):
            raise ValueError(
                f"dynamic batching preferred sizes {preferred} must be in "
                f"[1, {self.max_batch_size}]"
            )
        if default_policy is None:
            default_policy = QueuePolicy("REJECT", int(default_timeout_ns),
                                         allow_timeout_override)
        if max_queue_delay_ns < 0 or default_policy.default_timeout_ns < 0:
            raise ValueError("queue delay and timeout must be >= 0")
        if priority_levels < 0:
            raise ValueError("priority_levels must be >= 0")
        if priority_levels and not 1 <= default_priority_level <= priority_levels:
            raise ValueError(
                f"default priority level must be in range [1, {priority_levels}]"
            )
        self.preferred_batch_sizes = frozenset(preferred)
        self.max_preferred_batch_size = preferred[-1]
        self.max_queue_delay_ns = int(max_queue_delay_ns)
        self.preserve_ordering = preserve_ordering
        self.priority_levels = priority_levels
        self.default_priority_level = default_priority_level
        self._default_index = max(0, default_priority_level - 1)  # its queue's
        self.default_policy = default_policy
        self._hold = SchedulerHold(hold_until)

        # levels[0] is the highest priority (level 1); one level when priorities are off.
        policies = level_policies or {}
        self._levels = [_Level(policies.get(i + 1, default_policy))
                        for i in range(max(1, priority_levels))]
        self._count = 0  # live entries in the deques
        self._dead = 0  # dead entries still sitting in the deques
        self._timeouts: list[tuple[int, int, _Entry]] = []  # heap, may hold dead entries
        self._rejected: list[_Entry] = []  # found expired by next_batch, for expired()
        self._seq = itertools.count()

    # -- queueing -------------------------------------------------------------

    def enqueue(
        self,
        item: Any,
        *,
        batch_size: int,
        shape_key: Hashable,
        now: int,
        priority: int = 0,
        timeout_ns: int = 0,
    ) -> None:
        size = max(1, batch_size)  # Triton counts a non-batched request as 1
        if size > self.max_batch_size:
            raise ValueError(
                f"request batch size {size} exceeds max_batch_size {self.max_batch_size}"
            )
        # InferenceRequest::SetPriority: 0, or a level the model does not have,
        # means the default level; with priority_levels 0 there is one queue.
        if self.priority_levels and 1 <= priority <= self.priority_levels:
            index = priority - 1
        else:
            index = self._default_index
        level = self._levels[index]
        policy = level.policy
        if policy.max_queue_size and level.count >= policy.max_queue_size:
            raise QueueFull("Exceeds maximum queue size")
        # PolicyQueue::Enqueue: a request's own timeout may only shorten the
        # default, so it never applies when the default is 0 (no timeout).
        timeout = policy.default_timeout_ns
        if policy.allow_timeout_override and 0 < timeout_ns < timeout:
            timeout = timeout_ns
        seq = next(self._seq)
        deadline = now + timeout if timeout else 0
        entry = _Entry(item, size, shape_key, now, deadline, seq, index)
        level.queue.append(entry)
        level.count += 1
        self._count += 1
        if deadline and policy.timeout_action == "REJECT":
            heapq.heappush(self._timeouts, (deadline, seq, entry))

    def __len__(self) -> int:
        return self._count + len(self._rejected)

    # -- forming batches --------------------------------------------------------

    def _live(self) -> Iterator[_Entry]:
        """Live entries in dispatch order: priority level first, then arrival, then
        the level's delayed requests (which may grow while this walks)."""
        for level in self._levels:
            for entry in level.queue:
                if entry.live:
                    yield entry
            for entry in level.delayed:
                if entry.live:
                    yield entry

    def _gather(self, now: int | None):
        """Walk the queue head as GetDynamicBatch does.

        Returns ``(entries, size, best, send_now, oldest_ns)``: the requests that fit
        one batch, their total batch size, how many of them form the preferred prefix
        (0: none), whether the batch cannot grow, and the oldest enqueue time among
        them. With ``now``, requests past their queue timeout are set aside for
        ``expired()`` (REJECT) or moved behind their level (DELAY), as
        ApplyPolicyAtCursor does while the cursor walks.
        """
        entries: list[_Entry] = []
        size = 0
        best = 0
        send_now = False
        oldest = 0
        key = None
        for entry in self._live():
            # Expired at the deadline itself (Triton: strictly after), so the time
            # next_deadline() reports is one at which expired() returns the request.
            if now is not None and entry.deadline_ns and now >= entry.deadline_ns:
                self._expire(entry)
                continue
            if entries:
                total = size + entry.size
                # Adding this request would pass every preferred size: the batch so
                # far is the candidate to send before the delay expires.
                if total > self.max_preferred_batch_size and not best:
                    best = len(entries)
                # It does not fit at all: the batch is complete, send it now.
                if total > self.max_batch_size:
                    send_now = True
                    break
                # Equal-shape rule: a request of another shape ends the batch and
                # starts the next one.
                if entry.key != key:
                    send_now = True
                    break
            else:
                key = entry.key
                oldest = entry.enqueue_ns
            entries.append(entry)
            size += entry.size
            # Across priority levels the head need not be the oldest request.
            oldest = min(oldest, entry.enqueue_ns)
            # Exactly a preferred size: remember it; a later, larger one replaces it.
            if size in self.preferred_batch_sizes:
                best = len(entries)
        return entries, size, best, send_now, oldest

    def _ready_count(self, gathered, now: int | None) -> int:
        """How many gathered entries to dispatch now (0: wait): GetDynamicBatch's exits,
        in its order. With ``now`` None the time is unknown: the answer is what holds
        before the delay expires."""
        entries, size, best, send_now, oldest = gathered
        if not entries:
            return 0
        delay = self.max_queue_delay_ns
        exceeded = now is not None and delay != 0 and now - oldest >= delay
        # A preferred size (or the batch that the next request would push past the
        # largest preferred size) goes at once while the oldest request is within
        # its delay; batcher.md: "a batch of the largest possible preferred size".
        if best and not exceeded:
            return best
        # The batch cannot grow (next request does not fit, or it reached the largest
        # preferred size), the delay has expired, or there is no delay: send all.
        if send_now or size >= self.max_preferred_batch_size or exceeded or delay == 0:
            return len(entries)
        # Otherwise wait for more requests, at most until oldest + delay; batcher.md:
        # "if the delay expires the dynamic batcher sends the batch as is".
        return 0

    def next_batch(self, now: int) -> list | None:
        # the hook holds the first batch only; every priority level counts
        if self._hold.holding(self._count):
            return None
        count = self._ready_count(self._gather(now), now)
        if not count:
            return None
        batch = self._pop_front(count)
        self._maybe_compact()
        return batch

    @property
    def cuts_ahead(self) -> bool:
        """Whether a batch that cannot grow may be cut while every instance is busy
        (to wait at one, DynamicBatchScheduler.queue_at_instances): only where the
        instance, once free, would get the very same batch. So one level in arrival
        order, no queue timeout or bound (a request waiting at an instance could
        neither time out nor make room), no preferred size below the largest (which
        a batch cut later could pass), and no test hold. (preserve_ordering is the
        scheduler's to refuse: it also rules out a model that does not batch.)"""
        policy = self._levels[0].policy
        return (not self.priority_levels
                and self.preferred_batch_sizes == {self.max_batch_size}
                and not policy.default_timeout_ns and not policy.max_queue_size
                and not self._hold.active)

    def complete_batch(self, now: int) -> list | None:
        """The batch at the head if it cannot grow any more (full, or the next request
        does not fit or has another shape), as next_batch would cut it; else None."""
        entries, size, _, send_now, _ = self._gather(None)
        if not entries or not (send_now or size >= self.max_batch_size):
            return None
        batch = self._pop_front(len(entries))
        self._maybe_compact()
        return batch

    def _pop_front(self, count: int) -> list:
        """Pop the first ``count`` live entries (a prefix of ``_live()``)."""
        batch = []
        for level in self._levels:
            for queue in (level.queue, level.delayed):
                while queue and len(batch) < count:
                    entry = queue.popleft()
                    if not entry.live:
                        self._dead -= 1
                        continue
                    entry.live = False
                    level.count -= 1
                    batch.append(entry.item)
            if len(batch) == count:
                break
        self._count -= len(batch)
        return batch

    def next_deadline(self, batching: bool = True) -> int | None:
        """The earliest time something changes by itself: a queue timeout, or (with
        ``batching``, when an instance could take a batch) a partial batch's delay."""
        candidates = []
        if self._rejected:
            candidates.append(min(e.deadline_ns for e in self._rejected))
        heap = self._timeouts
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
        if heap:
            candidates.append(heap[0][0])
        if self._hold.active or not batching:
            return min(candidates) if candidates else None
        gathered = self._gather(None)
        entries, oldest = gathered[0], gathered[4]
        if entries and not self._ready_count(gathered, None):
            # A partial batch waits: at oldest + delay it goes as it is.
            candidates.append(oldest + self.max_queue_delay_ns)
        return min(candidates) if candidates else None

    # -- leaving the queue other than in a batch ---------------------------------

    def _expire(self, entry: _Entry) -> None:
        level = self._levels[entry.level]
        entry.live = False
        self._dead += 1
        if level.policy.timeout_action == "DELAY":
            # behind every unexpired request of its level, with no timeout any more
            level.delayed.append(_Entry(entry.item, entry.size, entry.key,
                                        entry.enqueue_ns, 0, entry.seq, entry.level))
            return
        level.count -= 1
        self._count -= 1
        self._rejected.append(entry)

    def expired(self, now: int) -> list:
        out = [e.item for e in self._rejected]
        self._rejected = []
        heap = self._timeouts
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.live:
                entry.live = False
                self._dead += 1
                self._count -= 1
                self._levels[entry.level].count -= 1
                out.append(entry.item)
        self._maybe_compact()
        return out

    def remove(self, predicate: Callable[[Any], bool]) -> list:
        # Cancellation and unload are rare: an O(queue) pass that also compacts.
        removed = []
        kept_rejected = []
        for entry in self._rejected:
            (removed if predicate(entry.item) else kept_rejected).append(entry)
        self._rejected = kept_rejected
        for entry in self._live():
            if predicate(entry.item):
                entry.live = False
                removed.append(entry)
        self._compact()  # recounts the live entries
        return [e.item for e in removed]

    def _maybe_compact(self) -> None:
        if self._dead > self._COMPACT_SLACK and self._dead > self._count:
            self._compact()
        elif len(self._timeouts) > 2 * self._count + self._COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop dead entries from the deques and the timeout heap: O(queue)."""
        for level in self._levels:
            level.queue = deque(e for e in level.queue if e.live)
            level.delayed = deque(e for e in level.delayed if e.live)
            level.count = len(level.queue) + len(level.delayed)
        self._count = sum(level.count for level in self._levels)
        self._dead = 0
        self._timeouts = [t for t in self._timeouts if t[2].live]
        heapq.heapify(self._timeouts)
