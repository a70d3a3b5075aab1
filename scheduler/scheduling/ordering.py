"""`dynamic_batching { preserve_ordering: true }`: responses leave in request order.

Triton (DynamicBatchScheduler with preserve_ordering) keeps a completion queue with one
slot per request, appended in the order requests leave the batcher for an instance;
each response fills its slot, and responses go out from the head of that queue only.
A batch that finishes early on one instance therefore waits for every batch sent
before it. The dispatch order is the arrival order within a priority level; across
levels (and for requests that a DELAY timeout moved back) it is the order in which the
batcher hands them out, as in Triton.

Only models with preserve_ordering pay for this: their workers put the small response
messages into BatchDone instead of sending them to each requester, and this buffer,
owned by the model's scheduler, hands them on. Tensors stay where the worker wrote
them; only descriptors wait here. Pure state: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class _Batch:
    __slots__ = ("requests", "results")

    def __init__(self, requests: list):
        self.requests = requests
        self.results: list | None = None  # one per request, once the batch is done


class ResponseOrder:
    """Completed batches' results, released strictly in dispatch order."""

    def __init__(self) -> None:
        self._queue: deque[_Batch] = deque()
        self._by_id: dict[int, _Batch] = {}

    def dispatched(self, batch_id: int, requests: list) -> None:
        batch = _Batch(requests)
        self._queue.append(batch)
        self._by_id[batch_id] = batch

    def done(self, batch_id: int, results: list[Any]) -> list[tuple[Any, Any]]:
        """A batch finished with one result per request (a response, or whatever the
        caller uses for a failure). Returns the (request, result) pairs that may go
        now, oldest first: none while an earlier batch is still running."""
        batch = self._by_id.pop(batch_id, None)
        if batch is None:
            return []  # unknown or already answered
        if len(results) != len(batch.requests):
            raise ValueError(f"batch {batch_id}: {len(results)} results for "
                             f"{len(batch.requests)} requests")
        batch.results = results
        out = []
        queue = self._queue
        while queue and queue[0].results is not None:
            head = queue.popleft()
            out.extend(zip(head.requests, head.results))
        return out

    def waiting(self) -> int:
        """Requests whose results are ready but held behind an earlier batch."""
        return sum(len(b.requests) for b in self._queue if b.results is not None)

    def __len__(self) -> int:
        """Batches not yet released (running, or done and held)."""
        return len(self._queue)
