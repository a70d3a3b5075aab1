"""The interfaces between the scheduler loop and the model schedulers.

Triton core gives each model one scheduler (dynamic batch, sequence batch or ensemble);
so does this process. Three small declarations, typing.Protocols (structural: a
scheduler, or a test's recorder, conforms without inheriting from anything, and nothing
is checked at run time, so the hot path pays nothing for them):

- `Scheduler`: what every scheduler has. Triton's core Scheduler has three pure
  virtuals (Enqueue, InflightInferenceCount, Stop); ours adds what a request that
  leaves early needs (cancel, a dead frontend) and the unload drain.
- `InstanceScheduler`: what only the schedulers that run batches on instances have
  (dynamic, sequence): pumping, deadlines, finished batches, instances lost and back.
  An ensemble has no instances, so it implements none of it.
- `Callbacks`: the one object the loop gives every scheduler and the model manager:
  everything a scheduler asks of the process (send a batch, answer a request, pump me,
  and for an ensemble's steps: make requests of its own and hand on their outputs).

Which requests form a batch is each scheduler's own business, and which instance runs
it is the shared RateLimiter's. A new kind of scheduler is a class in a module of its
own beside this one that implements `Scheduler` (and `InstanceScheduler` if it runs
batches on instances), and one branch in scheduling/factory.py's `create_scheduler`:
the frontends never see the difference. This module imports no scheduler, so every
scheduler can import it.

Schedulers hold each request as a `Queued` (scheduling/queued.py): the frozen wire
InferRequest, which goes on to the worker as it came, plus the scheduler's own stamps.
"""

from __future__ import annotations

from typing import Hashable, Protocol

from scheduler.scheduling.rate_limiter import InstanceSlot
from scheduler.stats import ModelStats
from shm.errors import ErrorCode
from scheduler.scheduling.queued import Queued
from shm.messages.frontend import InferRequest
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone, ExecuteBatch


class Scheduler(Protocol):
    """A model version's scheduler, as the loop and the model manager see it. Times
    are CLOCK_MONOTONIC ns, passed in: schedulers keep no clock, threads or sockets of
    their own."""

    name: str
    version: int
    stats: ModelStats
    accepting: bool  # False once the version unloads: new requests are refused

    def enqueue(self, q: Queued, now: int) -> None:
        """Take a request; raises InferError if it is refused (a full queue, a model
        that is unloading). A scheduler with something to run asks to be pumped
        (Callbacks.pump_soon)."""

    def cancel(self, reply_to: str, request_id: int, now: int) -> bool:
        """Drop a queued request whose client went away; True if it was queued here."""

    def drop_from(self, reply_to: str, now: int) -> list[Queued]:
        """A frontend died: remove its queued requests without answering them."""

    def begin_unload(self) -> None:
        """Refuse new requests; queued and running ones still finish."""

    @property
    def drained(self) -> bool:
        """Nothing queued or running."""

    @property
    def pending(self) -> int:
        """Requests queued here, waiting to be placed on an instance."""

    @property
    def waiting_at_instances(self) -> int:
        """Requests sent to wait at a busy instance's worker, not running yet; with
        `pending`, Triton's pending request count."""

    def waiting_from(self, reply_to: str) -> int:
        """Of those, the requests of frontend `reply_to`."""

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        """Fail everything queued or running (the server gave up waiting)."""

    def summary(self) -> str:
        """One log line of what ran."""


class InstanceScheduler(Scheduler, Protocol):
    """A scheduler whose batches run on model instances (Triton's dynamic and sequence
    batch schedulers). The loop pumps it, and the worker messages of its instances
    come back to it."""

    # whether its batches may end quietly (callbacks.send_batch): a BatchDone that only
    # frees the instance and counts statistics, which can wait for the loop's next wake
    quiet_done: bool

    def pump(self, now: int) -> None:
        """Send every batch that can go now to an instance the rate limiter grants."""

    def next_deadline(self) -> int | None:
        """When `pump` must run again if nothing else happens (None: on an event)."""

    def batch_done(self, msg: BatchDone, now: int) -> tuple[list[Queued], list[Hashable]]:
        """A batch finished: returns its requests and the schedulers the freed
        instance lets run (its own, and others waiting for the same resources)."""

    def instance_lost(self, slot: InstanceSlot, reason: str, now: int) -> int:
        """An instance's process died: fail what it ran; returns how many."""

    def instance_back(self, slot: InstanceSlot) -> None:
        """A restarted instance takes batches again."""

    def end_leases(self) -> None:
        """Ask for every lease on this model's instances back."""

    def lease_ended(self, instance: str, lease: int) -> list[Hashable]:
        """The worker of `instance` says its lease `lease` is over
        (shm/messages/leases.py): returns the schedulers the freed instance lets run."""

    def lease_queue(self, instance: str, lease: int, waiting: int) -> None:
        """The frontend holding deep lease `lease` on `instance` has `waiting`
        requests waiting at its worker (pending, with those waiting at instances)."""

    def running(self, slot: InstanceSlot) -> list[Queued]:
        """The requests `slot` is running now."""

    def running_on(self, reply_to: str, request_id: int) -> str | None:
        """The worker inbox running that request (or, decoupled, that ran it lately),
        to forward a cancel to; None if none is known."""

    def request_complete(self, reply_to: str, request_id: int) -> None:
        """The request sent its final response (ResponseStats)."""


class RequestOwner(Protocol):
    """Who gets the answers to a request the scheduler process makes itself (an
    ensemble, for its steps)."""

    def on_response(self, msg: InferResponse, now: int) -> None:
        """A response to one of its requests (a decoupled step sends several)."""

    def step_ran(self, request_id: int, msg: BatchDone) -> None:
        """The batch that ran one of its requests finished (its timings)."""


class Callbacks(Protocol):
    """What schedulers (and the model manager) ask of the loop that drives them: one
    object, given to each. The scheduler process implements it in
    scheduler/callbacks.py; unit tests pass a recorder."""

    address: str  # the process's inbox: responses to its own requests come here

    def clock(self) -> int:
        """The loop's clock (CLOCK_MONOTONIC ns): every `now` a scheduler is given."""

    def send_batch(self, slot: InstanceSlot, batch: ExecuteBatch,
                   requests: list[Queued]) -> None:
        """Hand a batch to the worker running `slot`; `requests` are its requests as
        the scheduler holds them (their stamps decide how its BatchDone is read)."""

    def fail(self, q: Queued, code: ErrorCode, reason: str) -> None:
        """Answer a request with an error; the request has ended."""

    def respond(self, q: Queued, response: InferResponse) -> None:
        """Hand on a response its worker relayed (preserve_ordering)."""

    def pump_soon(self, sched: InstanceScheduler) -> None:
        """Pump `sched` once the loop has read the messages at hand (batching what
        arrives together)."""

    def wake(self, sched: InstanceScheduler) -> None:
        """Pump `sched` now: called outside the loop's message handling (an instance
        came back, a version started to unload)."""

    # -- requests of the process's own (an ensemble's steps) ----------------------------

    def submit(self, owner: RequestOwner, req: InferRequest) -> int:
        """Give `req` an id (returned) and this process's inbox, route its responses
        (and its batch's BatchDone) to `owner`, and enqueue it to its model; raises
        InferError if it is refused."""

    def forget(self, request_id: int) -> None:
        """The owner expects nothing more for this request."""

    def cancel(self, request_id: int) -> None:
        """Drop a request of the process's own if it is still queued."""

    def finish(self, q: Queued, response: InferResponse,
               lent: dict[tuple[str, int], str]) -> None:
        """Answer a client (a decoupled ensemble answers several times, the last
        response carries `final`); `lent` maps each output block to its owner, to
        which the client's release is handed on."""

    def may_lend(self, slot: InstanceSlot) -> bool:
        """Whether the process allows lending `slot` to a frontend (shm/messages/leases.py):
        no execute timeout watches it and no trace samples requests."""

    def send_direct(self, slot: InstanceSlot, q: Queued) -> None:
        """Send the lessee's request `q` to the worker of `slot`, under its deep
        lease, as the lessee would have (ExecuteBatch.direct)."""

    def end_lease(self, slot: InstanceSlot) -> None:
        """Ask the worker of `slot` to end its lease (EndLease)."""

    def lease_lost(self, slot: InstanceSlot, reason: str) -> None:
        """`slot`'s process died while lent: tell the frontend that held it."""

    def release(self, owner: str, blocks: list[tuple[str, int]]) -> None:
        """Give blocks back to their owner: this process is done reading them."""
