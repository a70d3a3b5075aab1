"""Leases (shm/messages/leases.py): which requests a lease holder may send to the worker
straight, how the rate limiter keeps a lent instance out of the idle line, and when the
dynamic batch scheduler lends an instance, takes it back and counts what ran under it.
The scheduler runs as a state machine with fake callbacks (tests/unit/fake_callbacks.py)."""

import pytest
from tritonclient.grpc import model_config_pb2

from scheduler.scheduling.dynamic_scheduler import LEASE_AFTER, DynamicBatchScheduler
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from shm.messages.frontend import InferRequest, RequestedOutput, RequestOrigin
from shm.messages.leases import LEASE_DEPTH, goes_direct
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef
from tests.unit.fake_callbacks import FakeCallbacks

FE, FE2 = "ipc://fe", "ipc://fe2"
KEY = "m/1/m_0_0#1"


def _tensor(**kw) -> TensorRef:
    return TensorRef("X", "FP32", [1, 4], **({"data": bytes(16)} | kw))


def _infer(i=1, reply_to=FE, **kw) -> InferRequest:
    return InferRequest(i, reply_to, "m", 1, kw.pop("inputs", [_tensor()]), **kw)


# -- goes_direct -----------------------------------------------------------------------

def test_a_plain_client_request_goes_direct():
    assert goes_direct(_infer())
    assert goes_direct(_infer(outputs=[RequestedOutput("Y")]))  # named, no region
    # client regions too: the frontend resolves their names, or sends the request to
    # the scheduler when it cannot (tests/unit/test_dataplane_leases.py)
    assert goes_direct(_infer(outputs=[RequestedOutput("Y", target=TensorRef(
        "Y", "FP32", [1, 4], segment="r", nbytes=16, region=-1))]))
    assert goes_direct(_infer(inputs=[_tensor(data=None, segment="r", nbytes=16,
                                              region=-1)]))


@pytest.mark.parametrize("why, fields", [
    ("priority", {"priority": 1}),
    ("queue timeout", {"timeout_us": 1000}),
    ("sequence", {"sequence_id": 7}),
    ("string sequence", {"sequence_id": "s"}),
    ("response cache", {"cache_key": b"k"}),
    ("BLS call", {"origin": RequestOrigin.BLS, "callers": ["outer"]}),
    ("ensemble step", {"origin": RequestOrigin.ENSEMBLE}),
    ("callers alone", {"callers": ["outer"]}),
])
def test_what_the_scheduler_must_see_does_not_go_direct(why, fields):
    assert not goes_direct(_infer(**fields)), why


# -- the rate limiter --------------------------------------------------------------------

def _limiter(queueable=False):
    limiter, owner = RateLimiter(), object()
    slot = InstanceSlot(KEY, "m_0_0", "KIND_CPU", 0)
    slot.queueable = queueable
    limiter.add(owner, slot)
    return limiter, owner, slot


def _lent(queueable=False):
    """An instance running batch 1, which lent it (lease 5)."""
    limiter, owner, slot = _limiter(queueable)
    assert limiter.acquire(owner) is slot
    limiter.started(slot, 1)
    slot.lease, slot.lessee = 5, FE
    return limiter, owner, slot


def test_a_lent_instance_whose_batch_ends_stays_out_of_the_idle_line():
    limiter, owner, slot = _lent()
    assert limiter.finished(slot, 1) == []
    assert slot.batch is None and not limiter.available(owner)
    assert limiter.acquire(owner) is None
    assert limiter.lease_ended(slot, 6) == []  # another lease: not this one's end
    assert slot.lease == 5 and not limiter.available(owner)
    assert limiter.lease_ended(slot, 5) == [owner]
    assert (slot.lease, slot.lessee, slot.lease_ending) == (0, "", False)
    assert limiter.acquire(owner) is slot


def test_a_lease_over_before_its_granting_batch_ends_leaves_release_to_that_end():
    limiter, owner, slot = _lent()
    assert limiter.lease_ended(slot, 5) == []
    assert slot.lease == 0 and not limiter.available(owner)  # still running batch 1
    assert limiter.finished(slot, 1) == [owner]
    assert limiter.acquire(owner) is slot


def test_no_batch_is_sent_to_wait_at_a_lent_instance():
    limiter, owner, slot = _lent(queueable=True)
    assert limiter.queue_at(owner) is None
    slot.end_lease()
    assert limiter.queue_at(owner) is slot  # the same slot unlent would take one


def test_a_lost_instance_is_lent_no_more():
    limiter, owner, slot = _lent()
    slot.lease_ending = True
    limiter.lost(slot)
    assert (slot.lease, slot.lessee, slot.lease_ending) == (0, "", False)
    assert limiter.lease_ended(slot, 5) == []  # a late end frees nothing twice
    limiter.back(slot)
    assert limiter.acquire(owner) is slot


# -- the dynamic batch scheduler ----------------------------------------------------------

def _config(*, dynamic=False, preserve_ordering=False, decoupled=False):
    cfg = model_config_pb2.ModelConfig(name="m", max_batch_size=4 if dynamic else 0)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    if dynamic:
        cfg.dynamic_batching.max_queue_delay_microseconds = 0
        cfg.dynamic_batching.preferred_batch_size.append(4)
        cfg.dynamic_batching.preserve_ordering = preserve_ordering
    cfg.model_transaction_policy.decoupled = decoupled
    return cfg


class Harness:
    def __init__(self, config=None, limiter=None, queueable=True):
        self.sent, self.failed = [], []
        self.limiter = limiter or RateLimiter()
        self.cb = FakeCallbacks(lambda slot, b, _: self.sent.append(b),
                                lambda q, code, why: self.failed.append(q.req.id))
        self.s = DynamicBatchScheduler("m", 1, config or _config(), self.limiter, self.cb,
                                       environ={})
        self.slot = InstanceSlot(KEY, "m_0_0", "KIND_CPU", 0)
        self.slot.queueable = queueable
        self.limiter.add(self.s, self.slot)
        self._ids = iter(range(1, 1_000_000))

    def send(self, reply_to=FE, **kw):
        """A request enqueued and pumped; the batch it went out in, if any."""
        n = len(self.sent)
        self.s.enqueue(Queued(_infer(next(self._ids), reply_to, start_ns=1, **kw)), 0)
        self.s.pump(0)
        return self.sent[n] if len(self.sent) > n else None

    def finish(self, batch):
        return self.s.batch_done(BatchDone(batch.batch_id, batch.instance, 10, 20, 30, 40),
                                 0)

    def one_at_a_time(self, n, frontends=(FE,)):
        """`n` requests each sent after the one before it ended, the frontends taking
        turns: the lease each batch carried."""
        leases = []
        for i in range(n):
            batch = self.send(frontends[i % len(frontends)])
            assert batch is not None, "an idle instance did not take the request"
            leases.append(batch.lease)
            self.finish(batch)
        return leases

    def lend(self):
        """Lend the instance to FE; its granting batch ended. The lease id."""
        *before, lease = self.one_at_a_time(LEASE_AFTER)
        assert before == [0] * (LEASE_AFTER - 1) and lease
        return lease


def test_the_request_that_makes_a_streak_of_lease_after_carries_the_lease():
    h = Harness()
    lease = h.lend()
    assert (h.slot.lease, h.slot.lessee, h.s.leases_out) == (lease, FE, 1)
    assert not h.limiter.available(h.s)  # lent on after its batch ended


def test_a_dynamic_batch_model_that_cuts_ahead_is_leasable_too():
    h = Harness(_config(dynamic=True))
    h.lend()


def test_frontends_taking_turns_never_earn_a_lease():
    h = Harness()
    assert h.one_at_a_time(4 * LEASE_AFTER, (FE, FE2)) == [0] * (4 * LEASE_AFTER)


def test_a_request_that_finds_the_model_busy_starts_the_streak_again():
    """So for a model that batches: a request that found another running might have
    joined it in a batch (a deep lease's model, which runs each alone, is below)."""
    h = Harness(_config(dynamic=True))
    assert h.one_at_a_time(LEASE_AFTER - 2) == [0] * (LEASE_AFTER - 2)
    running = h.send()  # the streak's 15th
    assert h.send() is None  # finds it running: waits here to be batched, no streak
    h.finish(running)
    h.s.pump(0)
    waiting = h.sent[-1]
    assert (running.lease, waiting.lease) == (0, 0)
    h.finish(waiting)
    assert h.one_at_a_time(LEASE_AFTER - 1) == [0] * (LEASE_AFTER - 1)
    assert h.one_at_a_time(1) != [0]


def test_a_request_that_cannot_go_direct_starts_the_streak_again():
    h = Harness()
    assert h.one_at_a_time(LEASE_AFTER - 1) == [0] * (LEASE_AFTER - 1)
    h.finish(h.send(cache_key=b"k"))
    assert h.one_at_a_time(LEASE_AFTER - 1) == [0] * (LEASE_AFTER - 1)
    assert h.one_at_a_time(1) != [0]


@pytest.mark.parametrize("case", ["rate limiter", "preserve_ordering", "decoupled",
                                  "may_lend false"])
def test_models_whose_every_execution_must_be_seen_are_never_lent(case):
    h = Harness(
        _config(dynamic=True, preserve_ordering=True) if case == "preserve_ordering"
        else _config(decoupled=True) if case == "decoupled" else None,
        limiter=RateLimiter(enabled=True) if case == "rate limiter" else None)
    h.cb.lendable = case != "may_lend false"
    for _ in range(2 * LEASE_AFTER):
        batch = h.send()
        assert batch is not None and batch.lease == 0, case
        if batch.relay:  # preserve_ordering: the worker relays the responses
            h.s.batch_done(BatchDone(batch.batch_id, batch.instance, 10, 20, 30, 40,
                                     responses=[]), 0)
        else:
            h.finish(batch)
    assert h.s.leases_out == 0 and h.slot.lease == 0


def test_a_request_while_lent_takes_the_lease_back_once_then_runs_on_the_instance():
    h = Harness()
    lease = h.lend()
    assert h.send(FE2) is None  # not sent to wait at the lent instance either
    assert h.cb.ends == [(KEY, lease)] and h.slot.lease_ending
    assert h.send(FE) is None
    assert h.cb.ends == [(KEY, lease)], "EndLease sent again while one is pending"
    assert h.s.lease_ended(KEY, lease + 1) == []  # not this lease
    assert h.s.leases_out == 1 and h.slot.lease == lease
    assert h.s.lease_ended(KEY, lease) == [h.s]
    assert h.s.leases_out == 0 and h.slot.lease == 0
    h.s.pump(0)
    assert [r.id for b in h.sent[LEASE_AFTER:] for r in b.requests] == \
        [LEASE_AFTER + 1, LEASE_AFTER + 2]
    assert all(b.lease == 0 for b in h.sent[LEASE_AFTER:])


def test_a_request_while_the_granting_batch_runs_waits_for_the_lease_to_end():
    h = Harness()
    leases = h.one_at_a_time(LEASE_AFTER - 1)
    granting = h.send()
    assert granting.lease and leases == [0] * (LEASE_AFTER - 1)
    assert h.send(FE2) is None  # no batch waits at the lent instance
    assert h.cb.ends == [(KEY, granting.lease)]
    assert h.s.lease_ended(KEY, granting.lease) == []  # batch still running
    assert h.finish(granting)[1] == [h.s]  # its end frees the instance
    h.s.pump(0)
    assert [r.id for r in h.sent[-1].requests] == [LEASE_AFTER + 1]


def test_a_batch_run_under_a_lease_counts_in_statistics_and_frees_nothing():
    h = Harness()
    lease = h.lend()
    stats = h.s.stats
    before = (stats.success_count, stats.inference_count, stats.execution_count)
    requests, woken = h.s.batch_done(BatchDone(0, KEY, 10, 20, 30, 40,
                                               direct=[(5, 1)]), 0)
    assert (requests, woken) == ([], [])
    assert (stats.success_count, stats.inference_count, stats.execution_count) == \
        tuple(n + 1 for n in before)
    assert stats.queue_ns >= 5  # queued from the frontend's start (5) to the start (10)
    assert h.slot.lease == lease and h.slot.batch is None
    assert not h.limiter.available(h.s) and h.s.in_flight == {}


def test_an_instance_lost_while_lent_tells_its_lessee():
    h = Harness()
    lease = h.lend()
    h.s.instance_lost(h.slot, "worker died", 0)
    assert h.cb.lost == [(KEY, lease, FE, "worker died")]
    assert h.s.leases_out == 0 and h.slot.lease == 0
    assert h.s.lease_ended(KEY, lease) == []  # a late end changes nothing
    h.s.instance_back(h.slot)
    assert h.send() is not None


def test_an_instance_lost_while_not_lent_tells_nobody():
    h = Harness()
    h.one_at_a_time(3)
    h.s.instance_lost(h.slot, "worker died", 0)
    assert h.cb.lost == []


def test_an_unload_takes_the_lease_back_and_waits_for_its_end():
    # the worker of a lent instance may be stopped once the version drains: what the
    # frontend still sends under the lease must meet an ended lease there (handed on)
    h = Harness()
    lease = h.lend()
    h.s.begin_unload()
    assert h.cb.ends == [(KEY, lease)]
    assert not h.s.drained, "drained while lent"
    h.s.lease_ended(KEY, lease)
    assert h.s.drained


# -- client regions under leases ---------------------------------------------------------

def _registry(leases):
    from scheduler.regions import RegionRegistry
    from shm.messages.regions import CUDA, RegionOp, RegionRequest
    gone, published, ended = [], [], []
    registry = RegionRegistry(True, 1, gone.append)
    registry.publish = published.append
    registry.leases = lambda: list(leases)
    registry.end_leases = lambda: ended.append(True)
    registry.register(RegionRequest(1, FE, RegionOp.REGISTER, CUDA, "r", byte_size=64,
                                    raw_handle=bytes(64)))
    return registry, gone, published, ended


def test_frontends_hear_of_every_region_registered_and_unregistered():
    from shm.messages.regions import RegionShared, RegionUnshared
    registry, gone, published, ended = _registry([])
    assert published == [RegionShared(1, "r", "cuda", byte_size=64, raw_handle=bytes(64))]
    done = []
    registry.unregister("cuda", "r", lambda: done.append(True))
    assert published[-1] == RegionUnshared("r")
    assert done and len(gone) == 1 and not ended  # no lease out: nothing to wait for


def test_an_unregister_takes_the_leases_back_and_waits_for_them():
    """A frontend may have sent requests naming the region under its lease, resolved
    by itself: the region stays mapped until every lease out has ended."""
    registry, gone, published, ended = _registry([5, 6])
    done = []
    registry.unregister("cuda", "r", lambda: done.append(True))
    assert ended and not done and not gone
    assert "r" not in registry.by_name  # the name is gone at once
    registry.lease_over(5)
    assert not done and not gone
    registry.lease_over(6)
    assert done and len(gone) == 1
    registry.lease_over(6)  # heard twice: nothing more
    assert len(done) == 1 and len(gone) == 1


def test_no_lease_is_granted_while_a_region_waits_for_its_users():
    """A frontend that has not heard of the unregister yet would still resolve the
    name: LoopCallbacks.may_lend says no until the region is drained."""
    from types import SimpleNamespace

    from scheduler.callbacks import LoopCallbacks
    registry, *_ = _registry([5])
    callbacks = SimpleNamespace(trace=SimpleNamespace(active=False),
                                workers=SimpleNamespace(timeouts={}), regions=registry)
    slot = InstanceSlot(KEY, "m_0_0", "KIND_CPU", 0)
    slot.worker = object()
    assert LoopCallbacks.may_lend(callbacks, slot)
    registry.unregister("cuda", "r", lambda: None)
    assert not LoopCallbacks.may_lend(callbacks, slot)
    registry.lease_over(5)
    assert LoopCallbacks.may_lend(callbacks, slot)


# -- deep leases: the one instance of a model that runs every request alone -------------

def _overlapping(h, n, reply_to=FE):
    """`n` requests from `reply_to`, two in flight at a time (one runs, one waits at
    the instance), as from two clients of one frontend: the batches they went in."""
    batches = [h.send(reply_to)]
    for _ in range(n - 1):
        batches.append(h.send(reply_to))
        assert batches[-1] is not None, "no batch went to wait at the instance"
        h.finish(batches[-2])
    return batches


def test_a_deep_lease_is_earned_by_overlapping_requests_and_rides_on_a_batch_sent_ahead():
    h = Harness()  # no dynamic batcher, one instance
    batches = _overlapping(h, LEASE_AFTER)
    assert [b.lease for b in batches[:-1]] == [0] * (LEASE_AFTER - 1)
    granting = batches[-1]
    assert granting.ahead and granting.lease and granting.lease_depth == LEASE_DEPTH
    assert (h.slot.lease, h.slot.lessee) == (granting.lease, FE)
    h.finish(granting)  # the last batch this scheduler sent: the lease keeps the slot
    assert h.slot.batch is None and not h.limiter.available(h.s)


def test_the_lessees_requests_here_go_on_under_its_deep_lease():
    """Those it sent before it heard of the lease, or past its depth: sent on to the
    worker, not queued, and the lease stays."""
    h = Harness()
    granting = _overlapping(h, LEASE_AFTER)[-1]
    n = len(h.sent)
    h.s.enqueue(Queued(_infer(900, FE)), 0)
    h.s.pump(0)
    assert [(key, lease, q.req.id) for key, lease, q in h.cb.direct] == \
        [(KEY, granting.lease, 900)]
    assert len(h.sent) == n and len(h.s.batcher) == 0 and h.cb.ends == []
    # one that must be seen here (a priority) is queued, and takes the lease back
    h.s.enqueue(Queued(_infer(901, FE, priority=1)), 0)
    assert len(h.cb.direct) == 1 and h.cb.ends == [(KEY, granting.lease)]


def test_another_frontends_request_takes_a_deep_lease_back_and_runs_after_it():
    h = Harness()
    granting = _overlapping(h, LEASE_AFTER)[-1]
    assert h.send(FE2) is None
    assert h.cb.ends == [(KEY, granting.lease)]
    h.s.enqueue(Queued(_infer(950, FE)), 0)  # the lessee's, while the lease ends
    assert h.cb.direct == [] and len(h.s.batcher) == 2
    h.finish(granting)
    assert h.s.lease_ended(KEY, granting.lease) == [h.s]
    h.s.pump(0)  # in arrival order: one runs, the other waits at the instance
    assert [(b.requests[0].reply_to, b.ahead, b.lease) for b in h.sent[-2:]] == \
        [(FE2, False, 0), (FE, True, 0)]


def test_no_deep_lease_while_a_request_waits_here():
    """The lent instance takes no batch from the scheduler until the lease ends, so a
    request left queued would wait for another frontend's to end it."""
    h = Harness()
    batches = _overlapping(h, LEASE_AFTER - 1)
    h.s.enqueue(Queued(_infer(980, FE)), 0)  # queued behind the one waiting ahead
    h.s.enqueue(Queued(_infer(981, FE)), 0)
    h.finish(batches[-2])  # the one waiting starts; 980 goes ahead, 981 still here
    h.s.pump(0)
    assert h.sent[-1].requests[0].id == 980 and h.sent[-1].lease == 0
    assert len(h.s.batcher) == 1


def test_a_model_with_two_instances_gets_no_deep_lease():
    h = Harness()
    second = InstanceSlot(KEY + "b", "m_0_1", "KIND_CPU", 0)
    second.queueable = True
    h.limiter.add(h.s, second)
    for _ in range(2 * LEASE_AFTER):  # two at a time: each finds the other running
        a, b = h.send(), h.send()
        assert a.lease == 0 and b.lease == 0
        h.finish(a)
        h.finish(b)


def test_what_waits_at_the_worker_under_a_deep_lease_is_pending():
    """As its frontend tells it (LeaseQueue): counted with those waiting at instances
    (nv_inference_pending_request_count), for this lease only, until it ends."""
    h = Harness()
    granting = _overlapping(h, LEASE_AFTER)[-1]
    assert h.s.waiting_at_instances == 0
    h.s.lease_queue(KEY, granting.lease, 3)
    assert h.s.waiting_at_instances == 3
    h.s.lease_queue(KEY, granting.lease + 1, 1)  # another lease's word: not this one's
    assert h.s.waiting_at_instances == 3
    h.finish(granting)
    h.s.lease_ended(KEY, granting.lease)
    assert h.s.waiting_at_instances == 0
    h.s.lease_queue(KEY, granting.lease, 2)  # late: the lease is over
    assert h.s.waiting_at_instances == 0


def test_a_request_cancelled_while_it_waited_under_a_deep_lease_counts_as_cancelled():
    h = Harness()
    h.lend()
    stats = h.s.stats
    before = (stats.success_count, stats.execution_count, stats.fail_count)
    h.s.batch_done(BatchDone(77, KEY, 10, 10, 10, 10, direct=[(5, 1)], cancelled=[0]), 0)
    assert (stats.success_count, stats.execution_count, stats.fail_count) == \
        (before[0], before[1], before[2] + 1)
    assert stats.failures["CANCELED"] == 1


def test_the_lessees_requests_sent_on_are_pending_until_they_end_and_capped():
    """Those the scheduler sends on under a deep lease count as pending until their
    batch ends (its id is the request's); past LEASE_DEPTH of them at once the lease
    ends and the rest queue here, so a flooding client cannot fill the worker."""
    h = Harness()
    granting = _overlapping(h, LEASE_AFTER)[-1]
    for i in range(LEASE_DEPTH):
        h.s.enqueue(Queued(_infer(700 + i, FE)), 0)
    assert len(h.cb.direct) == LEASE_DEPTH and h.cb.ends == []
    assert h.s.waiting_at_instances == LEASE_DEPTH
    h.s.batch_done(BatchDone(700, KEY, 10, 20, 30, 40, direct=[(5, 1)]), 0)
    assert h.s.waiting_at_instances == LEASE_DEPTH - 1
    h.s.enqueue(Queued(_infer(800, FE)), 0)  # room again: sent on
    assert len(h.cb.direct) == LEASE_DEPTH + 1
    h.s.enqueue(Queued(_infer(801, FE)), 0)  # past the cap: queued, and the lease ends
    assert len(h.cb.direct) == LEASE_DEPTH + 1 and len(h.s.batcher) == 1
    assert h.cb.ends == [(KEY, granting.lease)]
    h.finish(granting)
    h.s.lease_ended(KEY, granting.lease)
    assert h.s.waiting_at_instances == 0  # what was sent on ended before the lease did
