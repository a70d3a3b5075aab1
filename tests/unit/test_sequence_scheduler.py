"""The sequence batch scheduler with the rate limiter and an injected clock: a
sequence's batches go to the one instance that holds its slot, the ExecuteBatch says
which slot each request fills, and finished batches let oldest's next requests go."""

import pytest
from tritonclient.grpc import model_config_pb2

from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from scheduler.scheduling.factory import create_scheduler
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.sequence_scheduler import SequenceBatchScheduler
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef
from tests.unit.fake_callbacks import FakeCallbacks

MS = 1_000_000


def _config(max_batch_size=2, oldest=False, idle_us=1_000_000):
    cfg = model_config_pb2.ModelConfig(name="acc", max_batch_size=max_batch_size)
    cfg.input.add(name="INPUT", data_type=model_config_pb2.TYPE_INT32, dims=[1])
    seq = cfg.sequence_batching
    seq.max_sequence_idle_microseconds = idle_us
    if oldest:
        seq.oldest.max_candidate_sequences = 2
    else:
        seq.direct.SetInParent()
    return cfg


_ids = iter(range(1, 10**9))


def _req(corrid, start=False, end=False):
    """A request as the loop hands it to the scheduler (scheduling/queued.py)."""
    return Queued(InferRequest(next(_ids), "fe", "acc", 1,
                               [TensorRef("INPUT", "INT32", [1, 1], data=bytes(4))],
                               sequence_id=corrid, sequence_start=start,
                               sequence_end=end))


class Harness:
    def __init__(self, config, instances=2):
        self.sent, self.failed = [], []
        self.limiter = RateLimiter()
        self.s = create_scheduler(
            "acc", 1, config, self.limiter,
            FakeCallbacks(lambda slot, b, _: self.sent.append((slot.key, b)),
                          lambda q, code, why: self.failed.append((q.req.id, code, why))),
            environ={})
        for i in range(instances):
            self.limiter.add(self.s, InstanceSlot(f"acc/1/acc_0_{i}#1", f"acc_0_{i}",
                                                  "KIND_CPU", 0))

    def done(self, index, now=0):
        batch = self.sent[index][1]
        return self.s.batch_done(BatchDone(batch.batch_id, batch.instance), now)


def test_create_scheduler_picks_the_sequence_batcher():
    """Rule: a config with sequence_batching gets Triton's sequence batch scheduler."""
    assert isinstance(Harness(_config()).s, SequenceBatchScheduler)


def test_sequence_runs_only_on_the_instance_of_its_slot():
    """Rule: a sequence owns one (instance, slot): while that instance is busy its
    next request waits, even with another instance idle."""
    h = Harness(_config(max_batch_size=1))
    h.s.enqueue(_req(1, start=True), 0)  # instance 0, slot 0
    h.s.enqueue(_req(2, start=True), 0)  # instance 1, slot 0
    h.s.pump(0)
    assert [(k[-6:], [r.sequence_id for r in b.requests]) for k, b in h.sent] == [
        ("_0_0#1", [1]), ("_0_1#1", [2])]
    h.done(1)
    h.s.enqueue(_req(1), 1)
    h.s.pump(1)
    assert len(h.sent) == 2  # instance 1 is idle, but sequence 1 lives on instance 0
    h.done(0)
    h.s.pump(2)
    assert h.sent[2][0].endswith("_0_0#1") and h.sent[2][1].slots == [0]


def test_execute_batch_names_slots_and_fillers():
    """Rule (direct): the batch message says which slot each request fills and which
    slots are not-ready fillers; the worker builds the rows from that."""
    h = Harness(_config(max_batch_size=2), instances=1)
    h.s.enqueue(_req(1, start=True), 0)
    h.s.enqueue(_req(2, start=True), 0)
    h.s.pump(0)
    h.done(0)
    h.s.enqueue(_req(2), 1)
    h.s.pump(1)
    batch = h.sent[1][1]
    assert batch.slots == [1] and batch.fillers == [0]


def test_oldest_next_request_waits_for_the_batch():
    """Rule (oldest): a sequence's next request goes only after its previous one ran."""
    h = Harness(_config(max_batch_size=2, oldest=True), instances=1)
    h.s.enqueue(_req(1, start=True), 0)
    h.s.pump(0)
    h.s.enqueue(_req(1), 1)
    h.s.pump(1)
    assert len(h.sent) == 1
    h.done(0, 2)
    h.s.pump(2)
    assert len(h.sent) == 2 and h.sent[1][1].requests[0].sequence_id == 1


def test_idle_deadline_and_release():
    """Rule: the scheduler wakes at the idle deadline and releases the slot."""
    h = Harness(_config(max_batch_size=1, idle_us=1000), instances=1)
    h.s.enqueue(_req(1, start=True), 0)
    h.s.pump(0)
    h.done(0, 1)
    assert h.s.next_deadline() == 1 * MS
    h.s.pump(1 * MS)
    h.s.enqueue(_req(2, start=True), 1 * MS + 1)
    h.s.pump(1 * MS + 1)
    assert h.sent[-1][1].requests[0].sequence_id == 2


def test_unload_refuses_new_sequences_and_fail_all():
    """Rule: a stopping scheduler refuses START (Triton's message) but lets running
    sequences go on; fail_all fails what is queued and running."""
    h = Harness(_config(max_batch_size=1), instances=1)
    h.s.enqueue(_req(1, start=True), 0)
    h.s.begin_unload()
    with pytest.raises(InferError, match="stopped accepting new inference requests"):
        h.s.enqueue(_req(2, start=True), 0)
    h.s.enqueue(_req(1, end=True), 0)
    h.s.pump(0)
    h.s.fail_all(ErrorCode.UNAVAILABLE, "gone", 1)
    assert len(h.failed) == 2 and h.s.drained


def test_oldest_preserve_ordering_relays_in_request_order():
    """Rule (oldest): preserve_ordering: workers relay responses through the scheduler,
    which hands them on in the order the requests were dispatched."""
    cfg = _config(max_batch_size=1, oldest=True)
    cfg.sequence_batching.oldest.preserve_ordering = True
    sent, answered = [], []
    limiter = RateLimiter()
    s = create_scheduler("acc", 1, cfg, limiter,
                         FakeCallbacks(lambda slot, b, _: sent.append(b),
                                       respond=lambda q, resp: answered.append(q.req.sequence_id)),
                         environ={})
    for i in range(2):
        limiter.add(s, InstanceSlot(f"acc/1/acc_0_{i}#1", f"acc_0_{i}", "KIND_CPU", 0))
    s.enqueue(_req(1, start=True), 0)
    s.enqueue(_req(2, start=True), 0)
    s.pump(0)
    assert [b.relay for b in sent] == [True, True]
    first, second = sent
    s.batch_done(BatchDone(second.batch_id, second.instance,
                           responses=[InferResponse(second.requests[0].id)]), 1)
    assert answered == []  # the batch dispatched first has not finished
    s.batch_done(BatchDone(first.batch_id, first.instance,
                           responses=[InferResponse(first.requests[0].id)]), 2)
    assert answered == [1, 2]


def test_rate_limiter_grants_one_given_instance():
    """Rule: a sequence's batch needs the instance of its slot: acquire_instance takes
    exactly that one when it is idle and its resources are free, and not otherwise."""
    limiter = RateLimiter(enabled=True)
    owner = object()
    a = InstanceSlot("m/1/a#1", "a", "KIND_CPU", 0, resources={("R", 0): 1})
    b = InstanceSlot("m/1/b#1", "b", "KIND_CPU", 0, resources={("R", 0): 1})
    limiter.add(owner, a)
    limiter.add(owner, b)
    assert limiter.instance_available(b) and limiter.acquire_instance(b)
    assert not limiter.acquire_instance(b)  # busy now
    assert not limiter.instance_available(a)  # idle, but R (1 unit) is in use
    assert not limiter.acquire_instance(a)
    limiter.started(b, 1)
    assert owner in limiter.release(b)
    assert limiter.acquire_instance(a)
