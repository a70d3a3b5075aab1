"""Leases: an instance lent to the frontend whose requests it runs, so that they go to
its worker straight, not through the scheduler (scheduler/scheduling/dynamic_scheduler.py
says when; workers/leases.py keeps them). A lease whose model batches is for a client
alone, one request at a time; one on the only instance of a model that runs each
request alone (Triton's default scheduler) is for one frontend, LEASE_DEPTH requests
at once, the worker holding those it has not run yet as the instance's queue."""

from __future__ import annotations

import msgspec

# requests a frontend may have at its worker under a deep lease: enough that the
# instance always has the next one at hand under a few clients at once, few enough that
# another frontend's request, which takes the lease back, waits behind few
LEASE_DEPTH = 4


class EndLease(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The scheduler wants lease `lease` on `instance` back (workers/leases.py)."""

    instance: str
    lease: int


class LeaseEnded(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                 frozen=True):
    """Lease `lease` on `instance` is over: from its worker, to the scheduler and the
    frontend that held it, after the last batch sent under it ended; from the
    scheduler to that frontend when the instance was lost (`lost`: the requests it
    sent under the lease that still run fail with `reason`); from the worker to that
    frontend again for each request it sent under the lease after its end, which the
    worker handed on to the scheduler (`request`: its id)."""

    instance: str
    lease: int
    lost: bool = False
    reason: str = ""
    request: int = 0


class LeaseQueue(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """From the frontend holding deep lease `lease` on `instance`, to the scheduler's
    quiet inbox (read on its next wake, and it wakes it only while something there is
    awaited): how many of its requests wait at the worker behind the one running,
    whenever that changes. The scheduler counts them as pending
    (nv_inference_pending_request_count, which a metrics scrape reads after the quiet
    inbox), as it counts those it sent to wait at an instance."""

    instance: str
    lease: int
    waiting: int


def goes_direct(req) -> bool:
    """Whether a frontend holding a lease may send this InferRequest straight to the
    instance: a client's request with no priority, timeout, sequence or response
    cache key. (One naming client regions goes if the frontend can resolve them:
    shm/messages/regions.py's RegionShared.)"""
    return not (req.priority or req.timeout_us or req.sequence_id or req.cache_key
                or req.origin or req.callers)
