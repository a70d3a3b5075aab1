"""preserve_ordering: the response buffer as pure state, and the dynamic batch
scheduler relaying responses through it when batches finish out of order. Rule
(model_config.proto, ModelDynamicBatching.preserve_ordering): responses are returned
in the same order as requests were sent to the model; Triton's completion queue
releases them from its head only."""

import pytest
from tritonclient.grpc import model_config_pb2

from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler
from scheduler.scheduling.ordering import ResponseOrder
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from shm.errors import ErrorCode
from shm.messages.frontend import InferRequest
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef
from tests.unit.fake_callbacks import FakeCallbacks


def test_a_batch_done_early_waits_for_every_batch_sent_before_it():
    order = ResponseOrder()
    order.dispatched(1, ["a", "b"])
    order.dispatched(2, ["c"])
    order.dispatched(3, ["d"])
    assert order.done(3, ["D"]) == []  # held behind batches 1 and 2
    assert order.done(2, ["C"]) == []
    assert order.waiting() == 2 and len(order) == 3
    assert order.done(1, ["A", "B"]) == [("a", "A"), ("b", "B"), ("c", "C"), ("d", "D")]
    assert len(order) == 0 and order.waiting() == 0


def test_in_order_completion_releases_at_once_and_unknown_batches_are_ignored():
    order = ResponseOrder()
    order.dispatched(7, ["x"])
    assert order.done(7, ["X"]) == [("x", "X")]
    assert order.done(7, ["X"]) == []  # answered already
    assert order.done(99, []) == []
    order.dispatched(8, ["y", "z"])
    with pytest.raises(ValueError):
        order.done(8, ["Y"])  # one result per request, always


def _config(preserve=True):
    cfg = model_config_pb2.ModelConfig(name="m", max_batch_size=2)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    cfg.dynamic_batching.preserve_ordering = preserve
    return cfg


def _req(i):
    return Queued(InferRequest(i, "ipc://fe", "m", 1,
                               [TensorRef("X", "FP32", [1, 4], data=bytes(16))],
                               batch_size=1, start_ns=0))


class Harness:
    def __init__(self, preserve=True):
        self.sent, self.out = [], []
        self.limiter = RateLimiter()
        self.s = DynamicBatchScheduler(
            "m", 1, _config(preserve), self.limiter,
            FakeCallbacks(lambda slot, b, _: self.sent.append(b),
                          lambda q, code, why: self.out.append((q.req.id, code)),
                          lambda q, resp: self.out.append((q.req.id, resp.id))), environ={})
        for i in range(2):
            self.limiter.add(self.s, InstanceSlot(f"m/1/m_0_{i}#1", f"m_0_{i}", "KIND_CPU", 0))

    def done(self, index):
        b = self.sent[index]
        msg = BatchDone(b.batch_id, b.instance, 1, 2, 3, 4,
                        responses=[InferResponse(r.id) for r in b.requests] if b.relay else [])
        self.s.batch_done(msg, 10)


def test_scheduler_relays_through_the_buffer_only_with_preserve_ordering():
    h = Harness()
    for i in (1, 2, 3):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)  # [1, 2] on one instance, [3] on the other
    assert [[r.id for r in b.requests] for b in h.sent] == [[1, 2], [3]]
    assert all(b.relay for b in h.sent)
    h.done(1)  # the later batch finishes first
    assert h.out == []
    h.done(0)
    assert h.out == [(1, 1), (2, 2), (3, 3)]

    plain = Harness(preserve=False)
    plain.s.enqueue(_req(1), 0)
    plain.s.pump(0)
    assert plain.sent[0].relay is False  # the worker answers the requester itself
    plain.done(0)
    assert plain.out == []


def test_a_lost_instance_fails_its_batch_in_order_and_frees_the_ones_behind_it():
    h = Harness()
    for i in (1, 2, 3):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    h.done(1)
    slot = next(s for s in h.limiter.slots(h.s) if s.batch == h.sent[0].batch_id)
    h.s.instance_lost(slot, "instance died", 20)
    assert h.out == [(1, ErrorCode.UNAVAILABLE), (2, ErrorCode.UNAVAILABLE), (3, 3)]
    assert (h.s.stats.fail_count, h.s.stats.success_count) == (2, 1)


def test_stopping_fails_what_runs_and_releases_what_was_held():
    h = Harness()
    for i in (1, 2, 3):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    h.done(1)
    h.s.fail_all(ErrorCode.UNAVAILABLE, "server is stopping", 30)
    assert h.out == [(1, ErrorCode.UNAVAILABLE), (2, ErrorCode.UNAVAILABLE), (3, 3)]
    assert h.s.drained
