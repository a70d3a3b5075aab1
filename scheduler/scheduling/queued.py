"""A request as the scheduler process holds it: the frozen wire message, and what the
scheduler learns about it while it waits.

The InferRequest a frontend (or a worker's BLS call, or an ensemble) sent is passed on
to the worker unchanged inside ExecuteBatch; the stamps below are the scheduler's own
(statistics, trace, response cache) and never cross a process boundary. Batchers,
schedulers, statistics, trace and the loop's callbacks hold `Queued`; the worker gets
`Queued.req`.
"""

from __future__ import annotations

import msgspec

from shm.messages.frontend import InferRequest


class Queued(msgspec.Struct, gc=False):
    """`req` plus the scheduler's stamps, CLOCK_MONOTONIC ns. A Struct, not a class with
    __init__: one is made per request on the hot path, and msgspec builds it in C
    (about half the time). gc=False: the collector need not track it, as it cannot
    be part of a cycle (nothing it holds refers back to it). Never encoded (it is no
    message)."""

    req: InferRequest
    # when it entered its model's queue (Triton's QUEUE_START); 0: not yet
    queue_ns: int = 0
    # how long its response cache lookup took (a miss), counted as cache_miss time
    cache_lookup_ns: int = 0
    # the trace extension sampled it (0: not traced)
    trace_id: int = 0
