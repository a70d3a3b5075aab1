"""A worker's side of deep leases (workers/main.py with workers/waiting.py): a request
its frontend sent behind another under the lease waits there as queued, so a cancel
answers it and its batch is over, counted as cancelled; one handed on after the lease
ended goes to the scheduler unless a cancel took it out first; and a grant whose
batch a cancel emptied before it ran still reaches the frontend. The Worker is real,
in this process with no model loaded; what it sends is recorded."""

import os

import pytest

from shm.messages.frontend import CancelRequest, InferRequest
from shm.messages.leases import LeaseEnded
from shm.messages.worker import BatchDone, ExecuteBatch
from workers.main import Worker

pytestmark = pytest.mark.timeout(30)

FE = "ipc://fe"
INSTANCE = "m/1/m_0#1"


@pytest.fixture
def worker(tmp_path):
    w = Worker("w", f"ipc://{tmp_path}/inbox", "ipc://sched", f"wl{os.getpid()}", 1 << 20)
    sent = []
    for outbox in (w.outbox, w.response_outbox):
        outbox.send = lambda address, msg, _s=sent: _s.append((address, msg))
    w.sent = sent
    yield w
    w.close()


def _request(rid):
    return InferRequest(rid, FE, "m", 1, [], start_ns=5)


def test_a_request_waiting_under_a_deep_lease_is_cancelled_there(worker):
    worker.leases.grant(INSTANCE, FE, 3)
    queued = ExecuteBatch(12, INSTANCE, [_request(12)], quiet=True, lease=3, direct=True,
                          ahead=True)
    worker.waiting.arrived(queued)
    worker.on_cancel(CancelRequest(12, FE))
    (to, answer), (done_to, done) = worker.sent
    assert to == FE and answer.id == 12 and answer.error.message == "request was cancelled"
    assert done_to == worker.done_address and isinstance(done, BatchDone)
    assert (done.cancelled, done.direct) == ([0], [(5, 1)])  # counted, never run
    worker.sent.clear()
    worker.leases.end(INSTANCE)  # the lease ends before its turn: not handed on
    worker.on_execute(queued)
    assert worker.sent == []


def test_a_request_waiting_when_its_lease_ends_is_handed_on_by_name(worker):
    worker.leases.grant(INSTANCE, FE, 3)
    queued = ExecuteBatch(12, INSTANCE, [_request(12)], quiet=True, lease=3, direct=True,
                          ahead=True)
    worker.waiting.arrived(queued)
    worker.leases.end(INSTANCE)
    worker.on_execute(queued)
    assert worker.sent == [("ipc://sched", _request(12)),
                           (FE, LeaseEnded(INSTANCE, 3, request=12))]
    assert worker.waiting.cancel(FE, 12) is None  # forgotten here: the scheduler's


def test_a_grant_whose_batch_a_cancel_emptied_still_reaches_its_frontend(worker):
    """A deep lease may ride on a batch sent to wait at the instance: cancelled before
    it ran, its answer carries the lease, or the frontend would send every request
    through the scheduler for as long as the lease lasts."""
    granting = ExecuteBatch(40, INSTANCE, [_request(7)], quiet=True, ahead=True, lease=9,
                            lease_depth=4)
    worker.leases.grant(INSTANCE, FE, 9)  # as on_execute does on reading it
    worker.waiting.arrived(granting)
    worker.on_cancel(CancelRequest(7, FE))
    (to, answer), _ = worker.sent
    assert to == FE and answer.error is not None
    assert answer.lease == (9, INSTANCE, worker.address, 4)
