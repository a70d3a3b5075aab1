"""Batches that wait at their instance behind the one it runs (ExecuteBatch.ahead).

The scheduler sends a request that runs alone to a busy instance's worker one batch
deep, so the instance starts it the moment the running one ends. Until it starts, such
a request is still queued as far as its client can tell: a cancel takes it out, and so
does its frontend's end, as the scheduler's queue would. The cancel is answered at once
(the model may run for a long while yet); a request whose frontend is gone is dropped
without an answer. A batch left with no request is over: its BatchDone goes at once,
saying which requests never ran (`cancelled`), and it is skipped when its turn comes;
one that still has requests runs them alone and says the same in its BatchDone.
"""

from __future__ import annotations

import threading

import msgspec

from shm.messages.worker import ExecuteBatch


def _key(msg: ExecuteBatch) -> tuple[str, int]:
    """A batch's name here: the scheduler's batch id, or for one sent under a deep
    lease (`direct`, its batch id its request's) that id and its frontend."""
    return (msg.requests[0].reply_to if msg.direct else "", msg.batch_id)


class WaitingBatches:
    """The ahead batches that reached this worker and have not started; shared by the
    receiving thread and the instances' threads. Those of a frontend holding a deep
    lease (shm/messages/leases.py) wait the same way: sent behind another of its
    requests, each is queued as far as its client can tell."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # _key -> (the batch, indices taken out)
        self._batches: dict[tuple[str, int], tuple[ExecuteBatch, set[int]]] = {}
        self._waiting: dict[tuple[str, int], tuple[str, int]] = {}  # request -> batch
        self._over: set[tuple[str, int]] = set()  # emptied, their turn not come

    def arrived(self, msg: ExecuteBatch) -> None:
        """`msg` reached this worker (read by a model's pump, it is seen again when
        its turn comes: once is enough)."""
        key = _key(msg)
        with self._lock:
            if key in self._batches or key in self._over:
                return
            self._batches[key] = (msg, set())
            for r in msg.requests:
                self._waiting[(r.reply_to, r.id)] = key

    def forget(self, msg: ExecuteBatch) -> bool:
        """`msg` will not run here after all (handed on to the scheduler): whether
        every request of it was taken out already (answered: nothing to hand on)."""
        key = _key(msg)
        with self._lock:
            if key in self._over:
                self._over.discard(key)
                return True
            if self._batches.pop(key, None) is not None:
                for r in msg.requests:
                    self._waiting.pop((r.reply_to, r.id), None)
            return False

    def cancel(self, reply_to: str, request_id: int):
        """Take a waiting request out: None if it is not waiting here (it runs, ran or
        never came: the caller tells a running model instead), else the batch it left
        and the indices taken out of it when none is left, or (None, [])."""
        with self._lock:
            batch = self._waiting.pop((reply_to, request_id), None)
            if batch is None:
                return None
            return self._take(batch, lambda r: r.reply_to == reply_to and r.id == request_id)

    def peer_gone(self, reply_to: str) -> list[tuple[ExecuteBatch, list[int]]]:
        """Its frontend is gone (nobody reads the answers, and its arena with the
        inputs went with it): take its requests out. Returns the batches left empty."""
        with self._lock:
            batches = {self._waiting.pop(k) for k in [k for k in self._waiting
                                                      if k[0] == reply_to]}
            over = [self._take(b, lambda r: r.reply_to == reply_to) for b in batches]
        return [o for o in over if o[0] is not None]

    def _take(self, key: tuple[str, int], which) -> tuple[ExecuteBatch | None, list[int]]:
        msg, out = self._batches[key]
        out.update(i for i, r in enumerate(msg.requests) if which(r))
        if len(out) < len(msg.requests):
            return None, []
        del self._batches[key]  # over: skipped when its turn comes
        self._over.add(key)
        return msg, sorted(out)

    def start(self, msg: ExecuteBatch) -> tuple[ExecuteBatch, list[int]] | None:
        """The batch's turn: None if it is over already, else the batch of the
        requests still in it and the indices of those taken out."""
        key = _key(msg)
        with self._lock:
            if key in self._over:
                self._over.discard(key)
                return None
            entry = self._batches.pop(key, None)
            if entry is None:  # never seen arriving (no ahead batch is): as it came
                return msg, []
            for r in msg.requests:
                self._waiting.pop((r.reply_to, r.id), None)
        out = entry[1]
        if not out:
            return msg, []
        kept = [r for i, r in enumerate(msg.requests) if i not in out]
        return msgspec.structs.replace(msg, requests=kept), sorted(out)
