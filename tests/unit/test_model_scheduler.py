"""Which instance runs a batch, and what happens to a batch whose instance dies."""

from tritonclient.grpc import model_config_pb2

from scheduler.model_scheduler import InstanceSlot, ModelScheduler
from shm.errors import ErrorCode
from shm.messages.frontend import InferRequest
from shm.tensor import TensorRef

MS = 1_000_000


def _config(max_batch_size=8, delay_us=1000):
    cfg = model_config_pb2.ModelConfig(name="m", max_batch_size=max_batch_size)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    if delay_us is not None:
        cfg.dynamic_batching.max_queue_delay_microseconds = delay_us
        cfg.dynamic_batching.preferred_batch_size.append(max_batch_size)
    return cfg


def _req(i, rows=1, cols=4):
    return InferRequest(i, "ipc://fe", "m", 1,
                        [TensorRef("X", "FP32", [rows, cols], data=bytes(rows * cols * 4))],
                        batch_size=rows)


class Harness:
    def __init__(self, config, instances=2):
        self.sent, self.failed = [], []
        self.ms = ModelScheduler("m", 1, config, lambda slot, b: self.sent.append((slot.key, b)),
                                 lambda r, code, why: self.failed.append((r.id, code, why)))
        for i in range(instances):
            self.ms.add_instance(InstanceSlot(f"m/1/m_0_{i}", f"m_0_{i}", "KIND_CPU", 0))


def test_requests_wait_for_the_delay_then_go_to_an_idle_instance():
    h = Harness(_config())
    h.ms.enqueue(_req(1), 0)
    h.ms.enqueue(_req(2), 10)
    assert h.ms.pump(20) == 1000 * 1000  # deadline: first request + 1 ms
    assert h.sent == []
    h.ms.pump(MS)
    assert len(h.sent) == 1
    key, batch = h.sent[0]
    assert [r.id for r in batch.requests] == [1, 2] and batch.instance == key


def test_busy_instances_hold_batches_back_until_one_is_done():
    h = Harness(_config(max_batch_size=1, delay_us=0), instances=1)
    for i in range(3):
        h.ms.enqueue(_req(i), 0)
    h.ms.pump(0)
    assert len(h.sent) == 1
    h.ms.pump(0)
    assert len(h.sent) == 1  # the only instance is busy
    h.ms.batch_done(h.sent[0][1].batch_id)
    h.ms.pump(0)
    assert len(h.sent) == 2


def test_shapes_that_differ_are_not_batched_together():
    h = Harness(_config(delay_us=0), instances=2)
    h.ms.enqueue(_req(1, cols=4), 0)
    h.ms.enqueue(_req(2, cols=5), 0)
    h.ms.pump(0)
    assert [[r.id for r in b.requests] for _, b in h.sent] == [[1], [2]]


def test_a_lost_instance_fails_its_batch_and_stops_getting_work():
    h = Harness(_config(max_batch_size=1, delay_us=0), instances=2)
    h.ms.enqueue(_req(1), 0)
    h.ms.enqueue(_req(2), 0)
    h.ms.pump(0)
    lost_key = h.sent[0][0]
    assert h.ms.instance_lost(lost_key, "worker died") == 1
    assert h.failed == [(1, ErrorCode.UNAVAILABLE, "worker died")]
    h.ms.batch_done(h.sent[1][1].batch_id)
    for i in range(3, 6):
        h.ms.enqueue(_req(i), 0)
        h.ms.pump(0)
        h.ms.batch_done(h.sent[-1][1].batch_id)
    assert all(key != lost_key for key, _ in h.sent[2:])
    h.ms.instance_back(lost_key)
    h.ms.enqueue(_req(9), 0)
    h.ms.enqueue(_req(10), 0)
    h.ms.pump(0)
    assert {key for key, _ in h.sent[-2:]} == {lost_key, h.sent[1][0]}


def test_default_scheduler_without_dynamic_batching_runs_one_request_per_batch():
    h = Harness(_config(delay_us=None), instances=1)
    h.ms.enqueue(_req(1), 0)
    h.ms.enqueue(_req(2), 0)
    h.ms.pump(0)
    assert [r.id for r in h.sent[0][1].requests] == [1]


def test_cancel_and_fail_all():
    h = Harness(_config(delay_us=10_000), instances=1)
    h.ms.enqueue(_req(1), 0)
    h.ms.enqueue(_req(2), 0)
    assert h.ms.cancel("ipc://fe", 1)
    assert h.failed[0][:2] == (1, ErrorCode.CANCELLED)
    h.ms.fail_all(ErrorCode.UNAVAILABLE, "stopping")
    assert [f[0] for f in h.failed] == [1, 2]
