"""The one interface the scheduler loop drives every loaded model version through.

Triton core gives each model one scheduler (dynamic batch, sequence batch or
ensemble); so does this process. The loop only ever calls what `Scheduler` declares;
which requests form a batch is each scheduler's own business, and which instance runs
it is the shared RateLimiter's. A new kind of scheduler is a class in a module of its
own beside this one that implements `Scheduler`, and one branch in
scheduling/factory.py's `create_scheduler`: the frontends never see the difference.
This module imports no scheduler, so every scheduler can import it.
"""

from __future__ import annotations

from typing import Callable, Hashable, Protocol

from scheduler.scheduling.rate_limiter import InstanceSlot
from scheduler.stats import ModelStats
from shm.errors import ErrorCode
from shm.messages.frontend import InferRequest
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone, ExecuteBatch

# send_batch(slot, batch): hand a batch to the worker running `slot`
SendBatch = Callable[[InstanceSlot, ExecuteBatch], None]
# fail(request, code, message): answer a request with an error
Fail = Callable[[InferRequest, ErrorCode, str], None]
# respond(request, response): hand on a response a worker relayed (preserve_ordering)
Respond = Callable[[InferRequest, InferResponse], None]


class Scheduler(Protocol):
    """A model version's scheduler, as the loop sees it. Times are CLOCK_MONOTONIC ns,
    passed in: schedulers keep no clock, threads or sockets of their own."""

    name: str
    version: int
    stats: ModelStats

    def enqueue(self, req: InferRequest, now: int) -> None:
        """Take a request; raises InferError if it is refused (a full queue, a model
        that is unloading)."""

    def pump(self, now: int) -> None:
        """Send every batch that can go now to an instance the rate limiter grants."""

    def next_deadline(self) -> int | None:
        """When `pump` must run again if nothing else happens (None: on an event)."""

    def batch_done(self, msg: BatchDone, now: int) -> tuple[list[InferRequest], list[Hashable]]:
        """A batch finished: returns its requests and the schedulers the freed
        instance lets run (its own, and others waiting for the same resources)."""

    def instance_lost(self, slot: InstanceSlot, reason: str, now: int) -> int:
        """An instance's process died: fail what it ran; returns how many."""

    def instance_back(self, slot: InstanceSlot) -> None:
        """A restarted instance takes batches again."""

    def cancel(self, reply_to: str, request_id: int, now: int) -> bool:
        """Drop a queued request whose client went away; True if it was queued here."""

    def drop_from(self, reply_to: str, now: int) -> list[InferRequest]:
        """A frontend died: remove its queued requests without answering them."""

    def running_on(self, reply_to: str, request_id: int) -> str | None:
        """The worker inbox running that request, to forward a cancel to (optional:
        the loop asks only schedulers that have it)."""

    def begin_unload(self) -> None:
        """Refuse new requests; queued and running ones still finish."""

    @property
    def drained(self) -> bool:
        """Nothing queued or running."""

    @property
    def pending(self) -> int:
        """Requests queued, not yet running (Triton's pending request count)."""

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        """Fail everything queued or running (the server gave up waiting)."""

    def summary(self) -> str:
        """One log line of what ran."""

