"""The dynamic batcher, instance groups and the rate limiter in the scheduler's loop
(tests/loop/rig.py): the real Server with in-memory channels and fake workers, which
hold every batch until the test finishes it. Each rule is proved from the batches the
workers got and from the statistics the server answers, with no timing: what is sent
in one pass of the loop arrives in one burst, as a burst of requests does on the
sockets, and batching deadlines fire when the test fires the timer. The models'
configs are tests/models_batcher's, checked against Triton 2.51; these tests took over
from the e2e tests named in each docstring."""

import asyncio

import pytest

from shm.errors import ErrorCode
from shm.messages.results import Error
from tests.loop.rig import ids, run
from tests.models_batcher.repo import CONFIGS, build


def _repo(tmp_path, *names, **configs):
    """tests/models_batcher's models, and others by config (name -> config lines)."""
    for name, text in configs.items():
        CONFIGS.setdefault(name, text)
    return build(tmp_path, [*names, *configs])


def _stats(reply: dict) -> dict:
    m = reply["model_stats"][0]
    inf = m["inference_stats"]
    return {"execution_count": m["execution_count"], "inference_count": m["inference_count"],
            "success": inf["success"]["count"], "fail": inf["fail"]["count"],
            "batch_stats": {b["batch_size"]: b["compute_infer"]["count"]
                            for b in m["batch_stats"]}}


async def _finish_all(rig, expect_batches: list[list[int]]) -> None:
    """Finish batches one at a time in the order sent, checking each is the next
    expected (a batch that cannot grow may already wait at the busy instance:
    tests/loop/test_waiting_at_instance.py)."""
    sent: list = []
    for want in expect_batches:
        if not sent:
            sent = await rig.batches_sent(1)
            rig.take_batches()
        worker, batch = sent.pop(0)
        assert ids(batch) == want
        worker.finish(batch)
    await rig.settle()
    assert not sent and not rig.batches, "a batch more than expected"


def test_priority_levels_first_batch_takes_the_high_priority_requests(tmp_path):
    """Rule: with priority_levels, a batch is filled from the highest level (1) first;
    priority 0 and one above priority_levels mean default_priority_level. (Was e2e
    test_batcher_rules.py::test_priority_levels_first_batch_takes_the_high_priority_requests.)"""
    async def test(rig):
        futs = [rig.send("prio", priority=p) for p in (9, 0, 1, 1)]  # ids 1..4
        await _finish_all(rig, [[3, 4], [1, 2]])
        assert [(await f).error for f in futs] == [None] * 4
        s = _stats(await rig.stats("prio"))
        assert (s["execution_count"], s["inference_count"], s["success"], s["fail"]) == \
            (2, 4, 4, 0)
        assert s["batch_stats"] == {2: 2}
    run(_repo(tmp_path, "prio"), test)


def test_preferred_batch_size_goes_at_once_not_after_the_delay(tmp_path):
    """Rule: a batch that reaches a preferred size is sent at once; the 30 s
    max_queue_delay never comes into it (the timer is never fired here). (Was e2e
    ::test_preferred_batch_size_goes_at_once_not_after_the_delay.)"""
    async def test(rig):
        futs = [rig.send("preferred") for _ in range(4)]
        await _finish_all(rig, [[1, 2], [3, 4]])
        await asyncio.gather(*futs)
        s = _stats(await rig.stats("preferred"))
        assert (s["execution_count"], s["inference_count"], s["batch_stats"]) == \
            (2, 4, {2: 2})
    run(_repo(tmp_path, "preferred"), test)


def test_a_request_of_another_shape_cuts_the_batch_short(tmp_path):
    """Rule: without allow_ragged_batch, requests batch only with equal shapes; the
    first that differs ends the batch though more of the first shape wait behind it.
    Queue: [1,4] [1,4] [1,6] [1,4]. (Was e2e ::test_a_request_of_another_shape_cuts_the_batch_short.)"""
    async def test(rig):
        futs = [rig.send("shapes", cols=c) for c in (4, 4, 6, 4)]
        await _finish_all(rig, [[1, 2], [3], [4]])
        await asyncio.gather(*futs)
        s = _stats(await rig.stats("shapes"))
        assert (s["execution_count"], s["inference_count"], s["batch_stats"]) == \
            (3, 4, {2: 1, 1: 2})
    run(_repo(tmp_path, "shapes"), test)


def test_optional_inputs_batch_only_with_the_same_set_of_inputs(tmp_path):
    """Rule: requests batch only with requests carrying the same inputs. Queue:
    [INPUT0] [INPUT0] [INPUT0+INPUT1] [INPUT0+INPUT1]. (Was e2e
    ::test_optional_inputs_batch_only_with_the_same_set_of_inputs.)"""
    async def test(rig):
        both = ("INPUT0", "INPUT1")
        futs = [rig.send("optional", cols=2, inputs=both if i >= 2 else ("INPUT0",))
                for i in range(4)]
        await _finish_all(rig, [[1, 2], [3, 4]])
        await asyncio.gather(*futs)
        s = _stats(await rig.stats("optional"))
        assert (s["execution_count"], s["batch_stats"]) == (2, {2: 2})
    run(_repo(tmp_path, "optional"), test)


@pytest.mark.parametrize("limited", [False, True])
def test_rate_limiter_keeps_models_that_share_a_resource_apart(tmp_path, limited):
    """Rule: --rate-limit=execution_count runs an instance only when its rate_limiter
    resources are free: with R:1, rl_b's request waits until rl_a's batch is done;
    without the rate limiter both run at once. (Were e2e
    ::test_rate_limiter_keeps_models_that_share_a_resource_apart and its control
    ::test_without_the_rate_limiter_two_models_run_at_once.)"""
    flags = ["--rate-limit=execution_count", "--rate-limit-resource=R:1"] if limited else []

    async def test(rig):
        a, b = rig.send("rl_a", cols=1), rig.send("rl_b", cols=1)
        await rig.batches_sent(1)
        await rig.settle()
        if not limited:
            assert sorted(ids(batch) for _, batch in rig.batches) == [[1], [2]]
            for worker, batch in rig.take_batches():
                worker.finish(batch)
        else:
            assert len(rig.batches) == 1, "R:1 lets one model run at a time"
            (worker, first), = rig.take_batches()
            worker.finish(first)
            (worker, second), = await rig.batches_sent(1)
            assert {ids(first)[0], ids(second)[0]} == {1, 2}
            rig.take_batches()
            worker.finish(second)
        assert (await a).error is None and (await b).error is None
    run(_repo(tmp_path, "rl_a", "rl_b"), test, *flags)


def test_max_queue_delay_gathers_one_batch(tmp_path):
    """Rule: a batch below every preferred size waits up to max_queue_delay, then goes
    as it is: three requests, one batch, sent only when the deadline fires. (Was e2e
    ::test_max_queue_delay_gathers_one_batch.)"""
    async def test(rig):
        sent = rig.clock()
        futs = [rig.send("loop_delay") for _ in range(3)]
        await rig.until(lambda: rig.timer.deadline is not None, "a batching deadline")
        await rig.settle()
        assert rig.batches == [], "nothing goes before the delay"
        assert rig.timer.deadline >= sent + 50_000_000
        rig.timer.fire()
        await _finish_all(rig, [[1, 2, 3]])
        await asyncio.gather(*futs)
        assert _stats(await rig.stats("loop_delay"))["batch_stats"] == {3: 1}
    run(_repo(tmp_path, loop_delay="""max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 50000 }
instance_group [ { count: 1 kind: KIND_CPU } ]"""), test)


def test_full_queue_rejects_with_unavailable_and_counts_nothing(tmp_path):
    """Rule: max_queue_size requests waiting -> the next is refused with UNAVAILABLE
    and Triton's message; it counts as neither success nor failure. (Was e2e
    ::test_full_queue_rejects_with_unavailable[grpc]; [http] stays e2e for the
    status and message on the wire.)"""
    async def test(rig):
        running = rig.send("qfull", cols=1)
        await rig.batches_sent(1)
        queued = rig.send("qfull", cols=1)
        refused = await rig.send("qfull", cols=1)
        assert refused.error.code == ErrorCode.UNAVAILABLE
        assert "Exceeds maximum queue size" in refused.error.message
        await _finish_all(rig, [[1], [2]])
        assert (await running).error is None and (await queued).error is None
        s = _stats(await rig.stats("qfull"))
        assert (s["success"], s["fail"]) == (2, 0)
    run(_repo(tmp_path, "qfull"), test)


def test_queue_timeout_reject_fails_only_the_expired_request(tmp_path):
    """Rule: timeout_action REJECT: a request queued longer than its timeout fails
    with UNAVAILABLE "Request timeout expired" while the instance is still busy, and
    counts as a failure that never ran. (Was e2e ::test_queue_timeout_reject[grpc].)"""
    async def test(rig):
        running = rig.send("loop_reject", cols=1)
        (worker, batch), = await rig.batches_sent(1)
        late = rig.send("loop_reject", cols=1)
        await rig.until(lambda: rig.timer.deadline is not None, "the queue timeout")
        rig.timer.fire()
        rejected = await late
        assert rejected.error == Error(ErrorCode.UNAVAILABLE, "Request timeout expired")
        assert not running.done(), "the rejection does not wait for the instance"
        rig.take_batches()
        worker.finish(batch)
        assert (await running).error is None
        s = _stats(await rig.stats("loop_reject"))
        assert (s["success"], s["fail"], s["execution_count"]) == (1, 1, 1)
    run(_repo(tmp_path, loop_reject="""max_batch_size: 1
dynamic_batching { default_queue_policy { timeout_action: REJECT
                                          default_timeout_microseconds: 20000 } }
instance_group [ { count: 1 kind: KIND_CPU } ]"""), test)


def test_queue_timeout_delay_and_override(tmp_path):
    """Rules: allow_timeout_override lets a request's own timeout shorten the default;
    timeout_action DELAY keeps an expired request but moves it behind every unexpired
    one: B (20 ms) is queued before C (30 s default) yet runs after it, and nothing
    fails. (Was e2e ::test_queue_timeout_delay_and_override.)"""
    async def test(rig):
        a = rig.send("qdelay", cols=1)
        (worker, batch), = await rig.batches_sent(1)
        rig.take_batches()
        b = rig.send("qdelay", cols=1, timeout_us=20_000)
        c = rig.send("qdelay", cols=1)
        await rig.settle()
        rig.clock.advance(20_000_001)  # B's timeout passes
        worker.finish(batch)
        await _finish_all(rig, [[c.request_id], [b.request_id]])
        assert [(await f).error for f in (a, b, c)] == [None] * 3
        s = _stats(await rig.stats("qdelay"))
        assert (s["success"], s["fail"]) == (3, 0)
    run(_repo(tmp_path, "qdelay"), test)


@pytest.mark.parametrize("model,ordered", [("ordered", True), ("unordered", False)])
def test_preserve_ordering_holds_a_fast_response_behind_a_slow_one(tmp_path, model,
                                                                   ordered):
    """Rule: with preserve_ordering, responses return in the order requests were sent
    to the model, even when a later one finishes first on another instance; without
    it, the fast one comes back first. (Was e2e
    ::test_preserve_ordering_holds_a_fast_response_behind_a_slow_one.)"""
    async def test(rig):
        slow = rig.send(model, cols=1)
        await rig.batches_sent(1)
        fast = rig.send(model, cols=1)
        (w1, b1), (w2, b2) = await rig.batches_sent(2)
        assert b1.instance != b2.instance  # side by side on two instances
        rig.take_batches()
        w2.finish(b2)  # the later request finishes first
        await rig.settle()
        assert fast.done() != ordered
        assert not slow.done()
        w1.finish(b1)
        assert (await slow).error is None and (await fast).error is None
    run(_repo(tmp_path, model), test)


def test_passive_instances_never_run_and_groups_are_named_as_triton_names_them(tmp_path):
    """Rule: an unnamed instance group is `<model>_<index>` and its instances
    `<group>_<index>`; a passive instance is loaded but never scheduled."""
    async def test(rig):
        rig.auto_finish = True
        futs = [rig.send("groups", cols=1) for _ in range(12)]
        await asyncio.gather(*futs)
        names = {batch.instance.split("/")[-1].split("#")[0] for _, batch in rig.batches}
        assert names and names <= {"pair_0", "pair_1", "groups_1_0"}, names
    run(_repo(tmp_path, "groups"), test)
