"""Leases: an idle instance lent to the frontend whose requests it runs one at a time,
so that they go to its worker straight, not through the scheduler (scheduler/leases.py
says when; workers/leases.py keeps them)."""

from __future__ import annotations

import msgspec


class EndLease(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The scheduler wants lease `lease` on `instance` back (workers/leases.py)."""

    instance: str
    lease: int


class LeaseEnded(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                 frozen=True):
    """Lease `lease` on `instance` is over: from its worker, to the scheduler and the
    frontend that held it, after the last batch sent under it ended; from the
    scheduler to that frontend when the instance was lost (`lost`: the request it
    sent under the lease, if one still runs, fails with `reason`)."""

    instance: str
    lease: int
    lost: bool = False
    reason: str = ""


def goes_direct(req) -> bool:
    """Whether a frontend holding a lease may send this InferRequest straight to the
    instance: a client's request with no priority, timeout, sequence or response
    cache key. (One naming client regions goes if the frontend can resolve them:
    shm/messages/regions.py's RegionShared.)"""
    return not (req.priority or req.timeout_us or req.sequence_id or req.cache_key
                or req.origin or req.callers)
