"""Scheduler <-> worker."""

from __future__ import annotations

import msgspec

from shm.messages.frontend import CancelRequest, InferRequest
from shm.messages.leases import EndLease, LeaseEnded
from shm.messages.regions import RegionGone
from shm.messages.results import InferResponse, PeerGone, ReleaseBlocks
from shm.messages.settings import LogSettings


class WorkerReady(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A worker process is up and listening on `address`."""

    name: str
    address: str
    pid: int


class LoadInstance(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                   frozen=True):
    """Load one model instance. `config` is the model config as the JSON Triton prints
    (what python models get in `args["model_config"]`), so workers need no protobuf.
    With `auto_complete`, the backend may fill the config in and returns it."""

    instance: str  # unique key of this instance within the server
    instance_name: str  # Triton's name for it, e.g. "add_sub_0_1"
    model: str
    version: int
    model_dir: str  # the model's directory (the version folder is inside)
    config: bytes
    kind: str = "KIND_CPU"
    device_id: int = 0
    auto_complete: bool = False
    # --backend-config settings for this model's backend (e.g. default-max-batch-size)
    backend_config: dict[str, str] = {}
    # loaded, never scheduled (instance_group passive: true); Triton skips its warmup
    passive: bool = False


class InstanceLoaded(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                     frozen=True):
    """Answer to LoadInstance, sent once the instance has run its model_warmup samples:
    ok, or the reason it failed; the (auto-completed) config as JSON."""

    instance: str
    ok: bool
    error: str = ""
    config: bytes = b""


class ExecuteBatch(msgspec.Struct, tag=True, array_like=True):
    """Run these requests on `instance` as one batch; answer each request's `reply_to`
    and then tell the scheduler with BatchDone. With `relay` (models with
    preserve_ordering) the responses go inside BatchDone instead, and the scheduler
    hands them on in request order. For a stateful model (sequence batcher) the
    worker adds the control and state tensors of each row (workers/sequence.py)."""

    batch_id: int
    instance: str
    requests: list[InferRequest]
    relay: bool = False
    # sequence batcher: each request's sequence slot on the instance, and the slots
    # whose rows are not-ready fillers (direct); rows then run in slot order
    slots: list[int] = []
    fillers: list[int] = []
    # send BatchDone to the scheduler's quiet inbox (done_address), which wakes it only
    # while it waits on an instance; the scheduler reads it on its next wake otherwise
    quiet: bool = False
    # sent to wait behind the batch the instance runs (workers/waiting.py): until it
    # starts, a cancel or its frontend's end takes a request out, as a queue would
    ahead: bool = False
    # Leases (workers/leases.py): from the scheduler, a batch of one client request
    # that also lends its instance to that request's frontend (this lease's id); from
    # a frontend holding the lease (`direct`), its request sent straight here
    lease: int = 0
    direct: bool = False
    # with the batch that grants a lease: how many of its requests the frontend may
    # send at once (shm/messages/leases.py, LEASE_DEPTH); 0 is one
    lease_depth: int = 0


class BatchDone(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """A batch finished (whatever each request's outcome): the instance is free. The
    times (CLOCK_MONOTONIC ns) bound Triton's compute_input, compute_infer and
    compute_output phases; `failed` lists the requests (by index) that failed."""

    batch_id: int
    instance: str
    compute_start_ns: int = 0
    input_end_ns: int = 0
    output_start_ns: int = 0
    compute_end_ns: int = 0
    failed: list[int] = []
    # bytes the instance has copied so far: [host, h2d, d2h, d2d] (workers/tensors.py)
    copies: list[int] = []
    # the batch's responses, one per request, when ExecuteBatch asked for `relay`
    responses: list[InferResponse] = []
    # requests of an ahead batch taken out before it started (by index): never run
    cancelled: list[int] = []
    # a batch a frontend sent under its lease, which the scheduler never saw: each
    # request's (start_ns, batch size), for the statistics
    direct: list[tuple[int, int]] = []


# Per-response statistics cover a request's first RESPONSE_STATS_INDICES responses.
# Triton keeps one entry per response index ever seen; one request to a model that
# answers per element of its input made the worker hold a timing per response until
# the request ended, and the scheduler an entry per index for good (300,000
# responses: +130 MiB in the scheduler, kept). Later responses are in the request's
# totals only.
RESPONSE_STATS_INDICES = 1 << 16


class ResponseStats(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The responses of one finished request of a decoupled model on `instance`, for
    Triton's per-response statistics: (index, kind, start_ns, output_start_ns, end_ns)
    each, kind 0 success, 1 fail, 2 empty (send(None, FINAL)); a response starts when
    the previous one ended (the first when the batch's inputs were ready)."""

    instance: str
    responses: list[tuple[int, int, int, int, int]]
    # the request (its requester's inbox and id): the scheduler stops routing cancels
    reply_to: str = ""
    id: int = 0


class UnloadInstance(msgspec.Struct, tag=True, array_like=True, frozen=True):
    instance: str


class StopWorker(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Finalize every instance, free the arena and exit."""


def done_address(scheduler: str) -> str:
    """The scheduler's quiet inbox, for the BatchDone of an ExecuteBatch with `quiet`."""
    return scheduler + ".done"


# InferRequest / CancelRequest: a python model's BLS calls (reply_to: the worker's inbox)
# InferRequest also: a frontend's request sent under a lease that had ended, handed on
TO_SCHEDULER_FROM_WORKER = (WorkerReady, InstanceLoaded, BatchDone, InferRequest,
                            CancelRequest, ResponseStats, LeaseEnded)
# CancelRequest: the scheduler forwards a client's cancel for a request that is running;
# InferResponse: answers to the worker's own BLS calls; ExecuteBatch and CancelRequest
# also come from frontends holding a lease
WORKER_INBOX = (LoadInstance, ExecuteBatch, UnloadInstance, StopWorker, ReleaseBlocks,
                PeerGone, RegionGone, LogSettings, CancelRequest, InferResponse, EndLease)
