"""The dynamic batch scheduler driven as a state machine with an injected clock (ns):
batch formation, instance choice through the rate limiter, queue policies, failures,
and the statistics each case leaves. Each test names the Triton rule it checks."""

import pytest
from tritonclient.grpc import model_config_pb2

from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter, group_resources
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef
from tests.unit.fake_callbacks import FakeCallbacks

US = 1_000
MS = 1_000_000


def _config(max_batch_size=8, delay_us=1000, preferred=None):
    cfg = model_config_pb2.ModelConfig(name="m", max_batch_size=max_batch_size)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    if delay_us is not None:
        cfg.dynamic_batching.max_queue_delay_microseconds = delay_us
        cfg.dynamic_batching.preferred_batch_size.extend(preferred or [max_batch_size])
    return cfg


def _req(i, rows=1, cols=4, inputs=("X",), reply_to="ipc://fe", start_ns=0, **kw):
    """A request as the loop hands it to the scheduler (scheduling/queued.py)."""
    tensors = [TensorRef(n, "FP32", [rows, cols], data=bytes(rows * cols * 4)) for n in inputs]
    return Queued(InferRequest(i, reply_to, "m", 1, tensors, batch_size=rows,
                               start_ns=start_ns, **kw))


class Harness:
    def __init__(self, config, instances=2, limiter=None, environ=None, slots=None):
        self.sent, self.failed = [], []
        self.limiter = limiter or RateLimiter()
        self.s = DynamicBatchScheduler(
            "m", 1, config, self.limiter,
            FakeCallbacks(lambda slot, b, _: self.sent.append((slot.key, b)),
                          lambda q, code, why: self.failed.append((q.req.id, code, why))),
            environ=environ or {})
        for slot in slots or [InstanceSlot(f"m/1/m_0_{i}#1", f"m_0_{i}", "KIND_CPU", 0)
                              for i in range(instances)]:
            self.limiter.add(self.s, slot)

    def ids(self):
        return [[r.id for r in b.requests] for _, b in self.sent]

    def done(self, index, now=0, failed=(), start=0):
        batch = self.sent[index][1]
        msg = BatchDone(batch.batch_id, batch.instance, start, start + 1 * US, start + 3 * US,
                        start + 6 * US, list(failed))
        return self.s.batch_done(msg, now)


def test_requests_wait_for_the_delay_then_go_to_an_idle_instance():
    # batcher.md: a partial batch waits at most max_queue_delay_microseconds
    h = Harness(_config())
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 10)
    h.s.pump(20)
    assert h.s.next_deadline() == 1000 * US  # first request + 1 ms
    assert h.sent == []
    h.s.pump(MS)
    key, batch = h.sent[0]
    assert h.ids() == [[1, 2]] and batch.instance == key


def test_busy_instances_hold_batches_back_until_one_is_done():
    # the batch is cut only when an instance is granted, so it keeps growing meanwhile
    h = Harness(_config(max_batch_size=4, delay_us=0), instances=1)
    h.s.enqueue(_req(0), 0)
    h.s.pump(0)
    for i in range(1, 4):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    assert h.ids() == [[0]]  # the only instance is busy
    assert h.s.next_deadline() is None  # no timer spins while nothing can run
    requests, woken = h.done(0)
    assert [q.req.id for q in requests] == [0] and woken == [h.s]
    h.s.pump(0)
    assert h.ids() == [[0], [1, 2, 3]]


def test_idle_instance_and_no_delay_dispatch_on_the_same_pump():
    # a request reaching an idle instance with nothing queued goes out at once
    h = Harness(_config(delay_us=0), instances=1)
    h.s.enqueue(_req(1), 5)
    h.s.pump(5)
    assert h.ids() == [[1]]


def test_shapes_that_differ_are_not_batched_together():
    # equal-shape rule: a request of another shape ends the batch
    h = Harness(_config(delay_us=0), instances=2)
    h.s.enqueue(_req(1, cols=4), 0)
    h.s.enqueue(_req(2, cols=5), 0)
    h.s.pump(0)
    assert h.ids() == [[1], [2]]


def test_input_order_does_not_change_the_shape_key():
    cfg = _config(delay_us=0)
    cfg.input.add(name="Y", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    h = Harness(cfg)
    a = _req(1, inputs=("X", "Y"))
    b = _req(2, inputs=("Y", "X"))
    assert h.s.shape_key(a) == h.s.shape_key(b)


def test_a_lone_input_keys_as_the_general_rule_does():
    """One input takes a shorter path to its key: the key must be the one the sorted
    tuple of every input gives, or requests of the two paths would not batch."""
    h = Harness(_config(delay_us=0))
    q = _req(1, cols=4)
    assert h.s.shape_key(q) == tuple(sorted((t.name, tuple(t.shape[1:]))
                                            for t in q.req.inputs)) == (("X", (4,)),)
    assert h.s.shape_key(_req(2, cols=5)) != h.s.shape_key(q)


def test_optional_inputs_batch_only_with_the_same_set_of_inputs():
    # RequiredEqualInputs with has_optional_input: same inputs, same count
    cfg = _config(delay_us=0)
    cfg.input.add(name="Y", data_type=model_config_pb2.TYPE_FP32, dims=[-1], optional=True)
    h = Harness(cfg, instances=3)
    h.s.enqueue(_req(1, inputs=("X",)), 0)
    h.s.enqueue(_req(2, inputs=("X",)), 0)
    h.s.enqueue(_req(3, inputs=("X", "Y")), 0)
    h.s.pump(0)
    assert h.ids() == [[1, 2], [3]]


def test_ragged_inputs_lift_the_equal_shape_rule():
    cfg = _config(delay_us=0)
    cfg.input[0].allow_ragged_batch = True
    h = Harness(cfg)
    h.s.enqueue(_req(1, cols=4), 0)
    h.s.enqueue(_req(2, cols=7), 0)
    h.s.pump(0)
    assert h.ids() == [[1, 2]]


def test_a_lost_instance_fails_its_batch_and_stops_getting_work():
    h = Harness(_config(max_batch_size=1, delay_us=0), instances=2)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    h.s.pump(0)
    lost = next(s for s in h.limiter.slots(h.s) if s.key == h.sent[0][0])
    assert h.s.instance_lost(lost, "worker died", 10) == 1
    assert h.failed == [(1, ErrorCode.UNAVAILABLE, "worker died")]
    assert h.s.stats.failures == {"OTHER": 1}
    h.done(1)
    for i in range(3, 6):
        h.s.enqueue(_req(i), 0)
        h.s.pump(0)
        h.done(len(h.sent) - 1)
    assert all(key != lost.key for key, _ in h.sent[2:])
    h.s.instance_back(lost)
    h.s.enqueue(_req(9), 0)
    h.s.enqueue(_req(10), 0)
    h.s.pump(0)
    assert {key for key, _ in h.sent[-2:]} == {lost.key, h.sent[1][0]}


def test_default_scheduler_without_dynamic_batching_runs_one_request_per_batch():
    h = Harness(_config(delay_us=None), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    h.s.pump(0)
    assert h.ids() == [[1]]


def test_cancel_and_fail_all_count_as_failures_with_their_reason():
    h = Harness(_config(delay_us=10_000), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    assert h.s.cancel("ipc://fe", 1, 5)
    assert h.failed[0][:2] == (1, ErrorCode.CANCELLED)
    h.s.fail_all(ErrorCode.UNAVAILABLE, "stopping", 5)
    assert [f[0] for f in h.failed] == [1, 2]
    assert h.s.stats.failures == {"CANCELED": 1, "OTHER": 1}
    assert h.s.stats.fail_count == 2


def test_a_dead_frontends_queued_requests_are_dropped_unanswered():
    """Its requests' inputs lie in the dead frontend's arena: none may run, none is
    answered (nobody reads), each counts as a failure; other frontends' stay queued."""
    h = Harness(_config(delay_us=10_000), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2, reply_to="ipc://fe2"), 0)
    h.s.enqueue(_req(3), 0)
    dropped = h.s.drop_from("ipc://fe", 5)
    assert sorted(q.req.id for q in dropped) == [1, 3]
    assert h.failed == []
    assert h.s.pending == 1
    assert h.s.stats.fail_count == 2
    h.s.pump(10_000_000)
    assert h.ids() == [[2]]


# -- queue policies ---------------------------------------------------------------

def _policy_config(**policy):
    cfg = _config(delay_us=10_000)
    for k, v in policy.items():
        setattr(cfg.dynamic_batching.default_queue_policy, k, v)
    return cfg


def test_full_queue_rejects_with_tritons_message():
    # PolicyQueue::Enqueue: max_queue_size requests queued -> UNAVAILABLE
    h = Harness(_policy_config(max_queue_size=2), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    with pytest.raises(InferError) as exc:
        h.s.enqueue(_req(3, request_id="r3"), 0)
    assert exc.value.code == ErrorCode.UNAVAILABLE
    assert exc.value.message == "[request id: r3] Exceeds maximum queue size"
    with pytest.raises(InferError) as exc:  # Triton 2.51 says this for a request with no id
        h.s.enqueue(_req(4), 0)
    assert exc.value.message == "[request id: <id_unknown>] Exceeds maximum queue size"
    assert h.s.stats.fail_count == 0  # refused before the queue: counted nowhere


def test_queue_timeout_reject_fails_the_request_as_rejected():
    h = Harness(_policy_config(default_timeout_microseconds=50), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.pump(0)
    assert h.s.next_deadline() == 50 * US
    h.s.pump(50 * US)
    assert h.failed == [(1, ErrorCode.UNAVAILABLE, "Request timeout expired")]
    assert h.s.stats.failures == {"REJECTED": 1}


def test_queue_timeout_delay_keeps_the_request_behind_unexpired_ones():
    # timeout_action DELAY: the expired request still runs, after the others
    h = Harness(_policy_config(default_timeout_microseconds=50_000, timeout_action=1,
                               allow_timeout_override=True), instances=1)
    h.s.enqueue(_req(1, timeout_us=10), 0)  # its own, shorter timeout applies
    h.s.enqueue(_req(2), 20 * US)
    h.s.pump(30 * US)  # request 1 expired: delayed behind request 2
    h.s.pump(10 * MS + 30 * US)  # the batch delay has passed
    assert h.failed == []
    assert h.ids() == [[2, 1]]


def test_priority_levels_each_with_their_policy():
    # priority_queue_policy applies per level; priority 0 or out of range -> default
    cfg = _config(max_batch_size=1, delay_us=0)
    db = cfg.dynamic_batching
    db.priority_levels = 2
    db.default_priority_level = 2
    db.priority_queue_policy[1].max_queue_size = 1
    h = Harness(cfg, instances=1)
    h.s.enqueue(_req(1, priority=2), 0)
    h.s.enqueue(_req(2, priority=0), 0)  # default level 2
    h.s.enqueue(_req(3, priority=1), 0)
    with pytest.raises(InferError, match="Exceeds maximum queue size"):
        h.s.enqueue(_req(4, priority=1), 0)  # level 1 holds one at most
    h.s.enqueue(_req(5, priority=7), 0)  # no such level: default level 2
    for i in range(4):
        h.s.pump(0)
        h.done(i)
    assert h.ids() == [[3], [1], [2], [5]]


def test_delay_scheduler_hook_holds_batching_until_n_requests():
    # TRITONSERVER_DELAY_SCHEDULER=N: nothing runs until N requests are queued, once
    h = Harness(_config(max_batch_size=8, delay_us=0), instances=1,
                environ={"TRITONSERVER_DELAY_SCHEDULER": "3"})
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    h.s.pump(0)
    assert h.sent == [] and h.s.next_deadline() is None
    h.s.enqueue(_req(3), 0)
    h.s.pump(0)
    assert h.ids() == [[1, 2, 3]]
    h.done(0)
    h.s.enqueue(_req(4), 0)
    h.s.pump(0)
    assert h.ids()[-1] == [4]  # the hold is over


def test_unloading_refuses_new_requests_but_finishes_queued_ones():
    h = Harness(_config(max_batch_size=1, delay_us=0), instances=1)
    h.s.enqueue(_req(1), 0)
    h.s.enqueue(_req(2), 0)
    h.s.begin_unload()
    with pytest.raises(InferError, match="stopped accepting new inference requests"):
        h.s.enqueue(_req(3), 0)
    h.s.pump(0)
    h.done(0)
    h.s.pump(0)
    assert not h.s.drained
    h.done(1)
    assert h.s.drained and h.ids() == [[1], [2]]


# -- instances and the rate limiter -----------------------------------------------

def test_passive_instances_are_never_scheduled():
    slots = [InstanceSlot("m/1/a#1", "a", "KIND_CPU", 0, passive=True),
             InstanceSlot("m/1/b#1", "b", "KIND_CPU", 0)]
    h = Harness(_config(max_batch_size=1, delay_us=0), slots=slots)
    for i in range(3):
        h.s.enqueue(_req(i), 0)
        h.s.pump(0)
        h.done(i)
    assert {key for key, _ in h.sent} == {"m/1/b#1"}


def _group(resources, priority=0, global_=False):
    g = model_config_pb2.ModelInstanceGroup(name="g", count=1)
    for name, count in resources:
        r = g.rate_limiter.resources.add(name=name, count=count)
        setattr(r, "global", global_)
    g.rate_limiter.priority = priority
    return g


def test_rate_limiter_resources_keep_two_models_from_running_together():
    # execution_count: an instance runs only with its resources; R has 1 unit
    limiter = RateLimiter(enabled=True)
    res = group_resources(_group([("R", 1)]), 0)
    a = Harness(_config(max_batch_size=1, delay_us=0), limiter=limiter,
                slots=[InstanceSlot("a/1/a#1", "a", "KIND_CPU", 0, resources=res)])
    b = Harness(_config(max_batch_size=1, delay_us=0), limiter=limiter,
                slots=[InstanceSlot("b/1/b#1", "b", "KIND_CPU", 0, resources=res)])
    a.s.enqueue(_req(1), 0)
    a.s.pump(0)
    b.s.enqueue(_req(2), 0)
    b.s.pump(0)
    assert a.ids() == [[1]] and b.sent == []  # R is taken by model a
    assert limiter.resource_use() == {("R", 0): (1, 1)}
    _, woken = a.done(0)
    assert woken == [a.s, b.s]  # the finished batch on a wakes b
    b.s.pump(0)
    assert b.ids() == [[2]]


def test_rate_limiter_explicit_count_too_small_is_tritons_error():
    limiter = RateLimiter(enabled=True, explicit=[("R", 1, -2)])
    slots = [InstanceSlot("m/1/a#1", "a", "KIND_CPU", 0,
                          resources=group_resources(_group([("R", 2)]), 0))]
    with pytest.raises(InferError) as exc:
        limiter.check(slots)
    assert exc.value.message == (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or '
        "more model instances, the minimum required count is 2")
    with pytest.raises(InferError, match='limited to 0'):  # unnamed -> unavailable
        RateLimiter(enabled=True, explicit=[("S", 4, -2)]).check(slots)


def test_rate_limiter_priority_weights_executions():
    # Triton: exec_count * max(priority, 1), lowest first
    limiter = RateLimiter(enabled=True)
    res = group_resources(_group([("R", 1)]), 0)
    hi = InstanceSlot("m/1/hi#1", "hi", "KIND_CPU", 0, resources=res, priority=1)
    lo = InstanceSlot("m/1/lo#1", "lo", "KIND_CPU", 0, resources=res, priority=3)
    h = Harness(_config(max_batch_size=1, delay_us=0), limiter=limiter, slots=[lo, hi])
    order = []
    for i in range(8):
        h.s.enqueue(_req(i), 0)
        h.s.pump(0)
        order.append(h.sent[-1][0])
        h.done(len(h.sent) - 1)
    # the priority-3 instance gets about a third of the executions of the other
    assert order.count("m/1/lo#1") == 2 and order.count("m/1/hi#1") == 6


def test_global_and_device_resources_are_counted_apart():
    g0 = group_resources(_group([("R", 1)]), 0)
    g1 = group_resources(_group([("R", 1)]), 1)
    assert g0 == {("R", 0): 1} and g1 == {("R", 1): 1}
    assert group_resources(_group([("G", 2)], global_=True), 1) == {("G", -1): 2}


# -- statistics --------------------------------------------------------------------

def test_statistics_count_batches_requests_and_phases():
    h = Harness(_config(max_batch_size=8, delay_us=0), instances=1)
    h.s.enqueue(_req(1, rows=2), 100)
    h.s.enqueue(_req(2, rows=3), 100)
    h.s.pump(100)
    h.done(0, start=1000, failed=[1])
    st = h.s.stats.as_json()
    assert st["execution_count"] == 1
    assert st["inference_count"] == 2  # only the successful request's rows
    infer = st["inference_stats"]
    assert infer["success"] == {"count": 1, "ns": 1000 + 6 * US}
    assert infer["queue"] == {"count": 1, "ns": 900}
    assert infer["compute_input"] == {"count": 1, "ns": 1 * US}
    assert infer["compute_infer"] == {"count": 1, "ns": 2 * US}
    assert infer["compute_output"] == {"count": 1, "ns": 3 * US}
    assert infer["fail"]["count"] == 1
    assert h.s.stats.failures == {"BACKEND": 1}
    assert st["batch_stats"] == [{"batch_size": 5,
                                  "compute_input": {"count": 1, "ns": 1 * US},
                                  "compute_infer": {"count": 1, "ns": 2 * US},
                                  "compute_output": {"count": 1, "ns": 3 * US}}]


def test_the_delay_counts_from_when_the_frontend_accepted_the_request():
    # the hop from the frontend is not batching delay: a request accepted at 0 and
    # queued here at 300 us is due at 1 ms, not 1.3 ms; one accepted a whole delay
    # ago goes to an idle instance on the same pump
    h = Harness(_config())
    h.s.enqueue(_req(1, start_ns=100 * US), 400 * US)
    assert h.s.next_deadline() == 1100 * US
    h.s.pump(1100 * US)
    assert h.ids() == [[1]]
    stale = _req(2, start_ns=2 * MS)
    h.s.enqueue(stale, 3 * MS)
    h.s.pump(3 * MS)
    assert h.ids() == [[1], [2]]
    # statistics still count the queue from the scheduler's enqueue
    assert stale.queue_ns == 3 * MS


def _queueable_slot(i=0):
    slot = InstanceSlot(f"m/1/m_0_{i}#1", f"m_0_{i}", "KIND_CPU", 0)
    slot.queueable = True  # the worker pool's word: no execute timeout watched
    return slot


def test_requests_that_run_alone_wait_at_a_busy_instance_one_batch_deep():
    # Triton's default scheduler runs requests one at a time; ours also sends the next
    # one to wait at the busy instance's worker, which starts it the moment the running
    # one ends instead of idling while that end reaches the scheduler and the next
    # batch comes back. One waits per instance; the rest stay queued here.
    h = Harness(_config(max_batch_size=0, delay_us=None), slots=[_queueable_slot()])
    for i in range(4):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    (slot,) = h.limiter.slots(h.s)
    assert h.ids() == [[0], [1]] and h.s.pending == 2
    assert (slot.batch, slot.ahead) == (h.sent[0][1].batch_id, h.sent[1][1].batch_id)
    requests, woken = h.done(0)
    assert [q.req.id for q in requests] == [0]
    assert woken == [h.s]  # pumped, to send the next to wait: 1 runs now
    assert (slot.batch, slot.ahead) == (h.sent[1][1].batch_id, None)
    h.s.pump(0)
    assert h.ids() == [[0], [1], [2]] and slot.ahead == h.sent[2][1].batch_id
    # the end of the waiting batch may be read before the running one's (its BatchDone
    # came through the other inbox): the instance stays busy until both are in
    h.done(2)
    assert (slot.batch, slot.ahead) == (h.sent[1][1].batch_id, None)
    h.s.pump(0)
    assert h.ids() == [[0], [1], [2], [3]]
    h.done(1)
    assert (slot.batch, slot.ahead) == (h.sent[3][1].batch_id, None)
    h.done(3)
    assert slot.batch is None and h.s.drained
    assert h.s.stats.success_count == 4 and h.s.stats.execution_count == 4


def test_who_may_not_wait_at_an_instance():
    # an instance whose worker watches an execute timeout (counted from when a batch is
    # sent) is not queueable; nor is anything under the rate limiter, whose resources
    # a waiting batch would not hold; nor a decoupled model's
    for slot, limiter in ((InstanceSlot("m/1/m_0_0#1", "m_0_0", "KIND_CPU", 0), None),
                          (_queueable_slot(), RateLimiter(enabled=True))):
        h = Harness(_config(max_batch_size=0, delay_us=None), slots=[slot], limiter=limiter)
        for i in range(3):
            h.s.enqueue(_req(i), 0)
        h.s.pump(0)
        assert len(h.sent) == 1 and slot.ahead is None
    decoupled = _config(max_batch_size=0, delay_us=None)
    decoupled.model_transaction_policy.decoupled = True
    assert not Harness(decoupled, slots=[_queueable_slot()]).s.queue_at_instances


def test_a_dynamic_batch_waits_at_an_instance_only_once_it_cannot_grow():
    # cut while the instance is busy, it must be the batch the instance would get once
    # free: full, or ended by a request that does not fit or has another shape
    h = Harness(_config(max_batch_size=4, delay_us=0), slots=[_queueable_slot()])
    (slot,) = h.limiter.slots(h.s)
    h.s.enqueue(_req(0), 0)
    h.s.pump(0)
    for i in range(1, 4):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    assert h.ids() == [[0]] and slot.ahead is None  # three could still become four
    h.s.enqueue(_req(4), 0)
    h.s.enqueue(_req(5, rows=2), 0)
    h.s.pump(0)
    assert h.ids() == [[0], [1, 2, 3, 4]] and slot.ahead == h.sent[1][1].batch_id
    h.done(0)  # the full one runs; [5] (2 rows) could still grow: it stays
    h.s.pump(0)
    assert h.ids() == [[0], [1, 2, 3, 4]] and h.s.pending == 1
    h.s.enqueue(_req(6, cols=8), 0)  # another shape: [5] cannot grow now
    h.s.pump(0)
    assert h.ids()[-1] == [5]


def test_a_dynamic_batch_is_never_cut_early_where_it_could_differ():
    # preferred sizes below the largest (a later cut could pass them), priority levels
    # (a later request could go first), queue timeouts or bounds (a request waiting at
    # an instance could neither time out nor make room), preserve_ordering
    preferred = _config(max_batch_size=4, delay_us=0, preferred=[2, 4])
    levels = _config(max_batch_size=4, delay_us=0)
    levels.dynamic_batching.priority_levels = 2
    levels.dynamic_batching.default_priority_level = 1
    timeout = _config(max_batch_size=4, delay_us=0)
    timeout.dynamic_batching.default_queue_policy.default_timeout_microseconds = 1000
    bounded = _config(max_batch_size=4, delay_us=0)
    bounded.dynamic_batching.default_queue_policy.max_queue_size = 100
    ordered = _config(max_batch_size=4, delay_us=0)
    ordered.dynamic_batching.preserve_ordering = True
    for config in (preferred, levels, timeout, bounded, ordered):
        assert not Harness(config, slots=[_queueable_slot()]).s.queue_at_instances
    assert Harness(_config(max_batch_size=4, delay_us=0),
                   slots=[_queueable_slot()]).s.queue_at_instances


def test_an_instance_lost_fails_the_batch_it_ran_and_the_one_waiting():
    h = Harness(_config(max_batch_size=0, delay_us=None), slots=[_queueable_slot()])
    for i in range(3):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    (slot,) = h.limiter.slots(h.s)
    assert h.s.instance_lost(slot, "worker died", 0) == 2
    assert sorted(i for i, _, _ in h.failed) == [0, 1] and h.s.pending == 1
    assert (slot.batch, slot.ahead) == (None, None) and not h.s.in_flight
    h.s.instance_back(slot)
    h.s.pump(0)
    assert h.ids()[-1] == [2] and slot.ahead is None


def test_requests_taken_out_at_the_worker_count_as_cancelled_and_never_ran():
    # workers/waiting.py: a cancel (or its frontend's end) took the waiting request
    # out; its batch's end says so, and only what ran counts as run
    h = Harness(_config(max_batch_size=0, delay_us=None), slots=[_queueable_slot()])
    for i in range(2):
        h.s.enqueue(_req(i), 0)
    h.s.pump(0)
    (slot,) = h.limiter.slots(h.s)
    assert h.s.waiting_at_instances == 1 and h.s.waiting_from("ipc://fe") == 1
    assert h.s.waiting_from("ipc://other") == 0
    ahead = h.sent[1][1]
    h.s.batch_done(BatchDone(ahead.batch_id, ahead.instance, 5, 5, 5, 5, cancelled=[0]), 5)
    assert slot.ahead is None and h.s.waiting_at_instances == 0
    st = h.s.stats
    assert (st.execution_count, st.fail_count, st.failures["CANCELED"]) == (0, 1, 1)
    h.done(0)
    assert (st.execution_count, st.success_count) == (1, 1) and h.s.drained
