"""One test per batching rule of scheduler.scheduling.batcher, driven by a fake clock (ns)."""

import pytest

from scheduler.scheduling.batcher import DefaultBatcher, DynamicBatcher

US = 1_000  # ns
DELAY = 100 * US
SHAPE = ("x", (3,))


def put(b, item, *, size=1, key=SHAPE, now=0, priority=0, timeout_ns=0):
    b.enqueue(item, batch_size=size, shape_key=key, now=now, priority=priority,
              timeout_ns=timeout_ns)


def drain(b, now):
    batches = []
    while (batch := b.next_batch(now)) is not None:
        batches.append(batch)
    return batches


# -- default scheduler --------------------------------------------------------

def test_default_batcher_is_fifo_one_request_per_batch():
    b = DefaultBatcher()
    for i, (key, prio) in enumerate([("a", 3), ("b", 1), ("a", 2)]):
        put(b, i, key=key, priority=prio, timeout_ns=1)
    assert len(b) == 3
    assert b.next_deadline() is None
    assert b.expired(10**12) == []
    assert drain(b, 0) == [[0], [1], [2]]
    assert len(b) == 0 and b.next_batch(0) is None


def test_default_batcher_remove():
    b = DefaultBatcher()
    for i in range(4):
        put(b, i)
    assert b.remove(lambda x: x % 2) == [1, 3]
    assert drain(b, 0) == [[0], [2]]


# -- dynamic batcher: when a batch goes -------------------------------------

def test_preferred_size_reached_dispatches_immediately():
    b = DynamicBatcher(8, [4], DELAY)
    for i in range(3):
        put(b, i)
    assert b.next_batch(0) is None
    put(b, 3)
    assert b.next_batch(0) == [0, 1, 2, 3]
    assert len(b) == 0


def test_largest_preferred_prefix_goes_before_the_delay():
    # batcher.md: "create a batch of the largest possible preferred size".
    b = DynamicBatcher(8, [2, 4], DELAY)
    for i in range(5):
        put(b, i)
    assert b.next_batch(0) == [0, 1, 2, 3]
    # The leftover request is not a preferred size: it waits for its delay.
    assert b.next_batch(0) is None
    for i in range(5, 7):
        put(b, i)
    assert b.next_batch(0) == [4, 5]  # 3 queued, largest preferred prefix is 2
    assert b.next_batch(0) is None


def test_max_batch_size_dispatches_immediately():
    b = DynamicBatcher(4, [], DELAY)  # preferred defaults to [max_batch_size]
    put(b, "a", size=3)
    assert b.next_batch(0) is None
    put(b, "b", size=1)
    assert b.next_batch(0) == ["a", "b"]


def test_partial_batch_waits_until_head_time_plus_delay():
    b = DynamicBatcher(8, [4], DELAY)
    put(b, "a", now=1_000)
    put(b, "b", now=5_000)
    assert b.next_batch(1_000) is None
    assert b.next_batch(1_000 + DELAY - 1) is None
    assert b.next_deadline() == 1_000 + DELAY  # the head's age, not the newest's


def test_partial_batch_goes_at_the_deadline():
    b = DynamicBatcher(8, [4], DELAY)
    put(b, "a", now=1_000)
    put(b, "b", now=5_000)
    deadline = b.next_deadline()
    assert b.next_batch(deadline - 1) is None
    assert b.next_batch(deadline) == ["a", "b"]
    assert b.next_deadline() is None and len(b) == 0


def test_after_the_delay_everything_gathered_goes_not_just_the_preferred_prefix():
    b = DynamicBatcher(8, [2], DELAY)
    for i in range(3):
        put(b, i)
    # No instance was idle before the delay expired: Triton sends all it gathered.
    assert b.next_batch(DELAY) == [0, 1, 2]


def test_shape_mismatch_ends_batch_and_heads_the_next():
    b = DynamicBatcher(8, [8], DELAY)
    put(b, "a1", key="A")
    put(b, "a2", key="A")
    put(b, "b1", key="B")
    put(b, "a3", key="A")
    assert b.next_batch(0) == ["a1", "a2"]  # immediately, well before the delay
    assert b.next_batch(0) == ["b1"]  # the mismatched request headed the next one
    assert b.next_batch(0) is None  # a3 is alone: it waits
    assert b.next_batch(DELAY) == ["a3"]


def test_request_that_does_not_fit_max_batch_size_ends_batch():
    early = DynamicBatcher(4, [4], DELAY)
    late = DynamicBatcher(4, [4], DELAY)
    for b in (early, late):
        put(b, "a", size=3)
        put(b, "b", size=2, now=1)
    assert early.next_batch(0) == ["a"]
    assert early.next_batch(0) is None
    assert early.next_deadline() == 1 + DELAY
    assert drain(late, 1 + DELAY) == [["a"], ["b"]]  # never above max_batch_size


def test_request_that_passes_largest_preferred_size_sends_the_prefix():
    # GetDynamicBatch marks the batch so far when the next request would pass every
    # preferred size; before the delay it sends that, after the delay everything.
    early = DynamicBatcher(8, [4], DELAY)
    late = DynamicBatcher(8, [4], DELAY)
    for b in (early, late):
        put(b, "a", size=3)
        put(b, "b", size=3)
    assert early.next_batch(0) == ["a"]
    assert late.next_batch(DELAY) == ["a", "b"]


def test_single_request_at_largest_preferred_size_goes_at_once():
    b = DynamicBatcher(8, [2], DELAY)
    put(b, "a", size=5)
    assert b.next_batch(0) == ["a"]


def test_zero_delay_dispatches_whatever_is_queued():
    b = DynamicBatcher(8, [], 0)
    put(b, "a")
    assert b.next_deadline() is None  # nothing to wait for
    assert b.next_batch(0) == ["a"]
    for i in range(3):
        put(b, i)
    assert b.next_batch(0) == [0, 1, 2]


def test_zero_delay_still_prefers_a_preferred_prefix():
    b = DynamicBatcher(8, [2], 0)
    for i in range(3):
        put(b, i)
    assert drain(b, 0) == [[0, 1], [2]]


def test_many_requests_form_several_batches_in_order():
    b = DynamicBatcher(4, [], DELAY)
    sizes = [1, 2, 1, 3, 1, 1, 2, 4, 1]
    for i, s in enumerate(sizes):
        put(b, i, size=s)
    assert drain(b, 0) == [[0, 1, 2], [3, 4], [5, 6], [7]]
    assert b.next_batch(DELAY) == [8]


def test_oversize_request_is_rejected():
    b = DynamicBatcher(4, [], DELAY)
    with pytest.raises(ValueError):
        put(b, "a", size=5)
    with pytest.raises(ValueError):
        DynamicBatcher(4, [8], DELAY)
    with pytest.raises(ValueError):
        DynamicBatcher(4, [], DELAY, priority_levels=2, default_priority_level=0)


def test_gathering_costs_the_batch_not_the_queue():
    compared = 0

    class Key:
        def __eq__(self, other):
            nonlocal compared
            compared += 1
            return True

        def __ne__(self, other):
            return not self.__eq__(other)

        __hash__ = object.__hash__

    b = DynamicBatcher(4, [], DELAY)
    for i in range(2_000):
        b.enqueue(i, batch_size=1, shape_key=Key(), now=0)
    assert b.next_batch(0) == [0, 1, 2, 3]
    assert compared <= 4
    b.next_deadline()
    assert compared <= 8


# -- priorities ---------------------------------------------------------------

def test_higher_priority_levels_go_first():
    b = DynamicBatcher(1, [], DELAY, priority_levels=3, default_priority_level=2)
    put(b, "low", priority=3)
    put(b, "default", priority=0)  # 0: the default level
    put(b, "unknown", priority=9)  # a level the model lacks: the default level
    put(b, "high", priority=1)
    assert drain(b, 0) == [["high"], ["default"], ["unknown"], ["low"]]


def test_a_batch_spans_priority_levels_in_order():
    b = DynamicBatcher(8, [3], DELAY, priority_levels=2, default_priority_level=2)
    put(b, "low", now=0)
    put(b, "high", now=50 * US, priority=1)
    assert b.next_batch(50 * US) is None
    # The oldest request in the gathered batch sets the deadline, not the head.
    assert b.next_deadline() == DELAY
    put(b, "high2", now=60 * US, priority=1)
    assert b.next_batch(60 * US) == ["high", "high2", "low"]


def test_priority_ignored_without_priority_levels():
    b = DynamicBatcher(1, [], DELAY)
    put(b, "a", priority=2)
    put(b, "b", priority=1)
    assert drain(b, 0) == [["a"], ["b"]]


# -- queue timeouts ---------------------------------------------------------

def test_default_timeout_expires_requests():
    b = DynamicBatcher(8, [4], DELAY, default_timeout_ns=30 * US)
    put(b, "a", now=0)
    put(b, "b", now=10 * US)
    assert b.next_deadline() == 30 * US  # earlier than the batch delay
    assert b.expired(30 * US - 1) == []
    assert b.expired(30 * US) == ["a"]
    assert len(b) == 1
    assert b.next_deadline() == 40 * US
    assert b.expired(10**9) == ["b"]
    assert len(b) == 0 and b.next_batch(10**9) is None and b.next_deadline() is None


def test_timeout_override_may_only_shorten_the_default():
    b = DynamicBatcher(8, [], DELAY, default_timeout_ns=50 * US,
                       allow_timeout_override=True)
    put(b, "short", timeout_ns=10 * US)
    put(b, "long", timeout_ns=80 * US)  # cannot extend the default
    assert b.expired(10 * US) == ["short"]
    assert b.expired(50 * US) == ["long"]

    no_override = DynamicBatcher(8, [], DELAY, default_timeout_ns=50 * US)
    put(no_override, "a", timeout_ns=10 * US)
    assert no_override.expired(10 * US) == []
    assert no_override.expired(50 * US) == ["a"]

    # Triton's PolicyQueue::Enqueue: with no default timeout, none applies.
    unbounded = DynamicBatcher(8, [], DELAY, allow_timeout_override=True)
    put(unbounded, "a", timeout_ns=10 * US)
    assert unbounded.next_deadline() == DELAY
    assert unbounded.expired(10**9) == []


def test_expired_request_is_not_batched_and_is_handed_to_expired():
    b = DynamicBatcher(8, [], 0, default_timeout_ns=100 * US,
                       allow_timeout_override=True)
    put(b, "late", timeout_ns=10 * US)
    put(b, "ok")
    assert b.next_batch(20 * US) == ["ok"]
    assert len(b) == 1
    assert b.next_deadline() <= 20 * US  # wake now to fail it
    assert b.expired(20 * US) == ["late"]
    assert len(b) == 0 and b.next_deadline() is None


# -- removal ------------------------------------------------------------------

def test_remove_takes_requests_out_of_the_queue():
    b = DynamicBatcher(8, [4], DELAY, default_timeout_ns=10 * DELAY)
    for i in range(4):
        put(b, i)
    assert b.remove(lambda x: x == 1) == [1]
    assert len(b) == 3
    assert b.next_batch(0) is None  # 3 left: no longer a preferred size
    put(b, 4)
    assert b.next_batch(0) == [0, 2, 3, 4]
    assert b.remove(lambda x: True) == []
    assert b.next_deadline() is None and b.expired(10**12) == []


def test_queue_stays_consistent_after_many_expiries_in_the_middle():
    b = DynamicBatcher(4, [], 0, default_timeout_ns=DELAY, allow_timeout_override=True)
    for i in range(300):
        put(b, i, timeout_ns=US if i % 3 else 0)
    assert sorted(b.expired(US)) == [i for i in range(300) if i % 3]
    assert len(b) == 100
    batches = drain(b, US)
    assert [i for batch in batches for i in batch] == list(range(0, 300, 3))
    assert all(len(batch) == 4 for batch in batches[:-1])
    assert len(b) == 0 and b.next_deadline() is None
