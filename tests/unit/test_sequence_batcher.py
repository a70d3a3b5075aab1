"""The sequence batcher's rules, driven by an injected clock (no processes)."""

import pytest

from scheduler.scheduling.delay_hooks import SchedulerHold
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.sequence_batcher import SequenceBatcher
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.tensor import TensorRef

MS = 1_000_000
_ids = iter(range(1, 10**9))


def req(corrid, start=False, end=False, shape=(1, 1), batch_size=1, accepted_ns=0,
        timeout_us=0):
    """A request as the scheduler holds it (scheduling/queued.py)."""
    return Queued(InferRequest(next(_ids), "fe", "acc", 1,
                               [TensorRef("INPUT", "INT32", list(shape), data=b"\0" * 4)],
                               batch_size=batch_size, sequence_id=corrid,
                               sequence_start=start, sequence_end=end,
                               start_ns=accepted_ns, timeout_us=timeout_us))


def direct(instances=("i0",), slots=4, **kw):
    b = SequenceBatcher("acc", slots_per_instance=slots, max_batch_size=slots, **kw)
    for key in instances:
        b.add_instance(key)
    return b


def oldest(instances=("i0",), candidates=4, max_batch_size=4, **kw):
    b = SequenceBatcher("acc", oldest=True, slots_per_instance=candidates,
                        max_batch_size=max_batch_size, **kw)
    for key in instances:
        b.add_instance(key)
    return b


def ids(batch):
    return [q.req.sequence_id for q in batch.requests]


def test_direct_each_sequence_keeps_its_slot():
    """Rule (direct): a sequence owns one slot for its life; new sequences take the
    lowest free slot; a batch holds one request per slot, in slot order."""
    b = direct()
    b.enqueue(req(7, start=True), 0)
    b.enqueue(req(9, start=True), 0)
    b.enqueue(req(7), 0)
    batch = b.next_batch("i0", 1)
    assert ids(batch) == [7, 9] and batch.slots == [0, 1] and batch.fillers == []
    batch = b.next_batch("i0", 2)
    assert ids(batch) == [7] and batch.slots == [0]
    assert b.next_batch("i0", 3) is None


def test_direct_filler_rows_below_highest_ready_slot():
    """Rule (direct): a batch spans slots 0..highest ready; slots with nothing ready
    below it are not-ready fillers, so each sequence stays in its row."""
    b = direct()
    for c in (1, 2, 3):
        b.enqueue(req(c, start=True), 0)
    b.next_batch("i0", 0)
    b.enqueue(req(3), 1)  # only the sequence in slot 2 sends
    batch = b.next_batch("i0", 2)
    assert ids(batch) == [3] and batch.slots == [2] and batch.fillers == [0, 1]


def test_backlog_takes_the_first_slot_freed_fifo():
    """Rule: with no free slot a new sequence waits in a FIFO backlog and takes the
    first slot freed by an END; its queued requests follow it there."""
    b = direct(slots=1)
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(2, start=True), 0)
    b.enqueue(req(3, start=True), 0)
    b.enqueue(req(2), 0)
    assert b.backlogged() == 3
    assert ids(b.next_batch("i0", 1)) == [1]
    assert b.next_batch("i0", 2) is None  # sequence 1 still holds the slot
    b.enqueue(req(1, end=True), 3)
    assert ids(b.next_batch("i0", 4)) == [1]
    # slot freed: sequence 2 (first in the backlog) has it, with both its requests
    assert ids(b.next_batch("i0", 5)) == [2]
    assert ids(b.next_batch("i0", 6)) == [2]
    b.enqueue(req(2, end=True), 7)
    b.next_batch("i0", 8)
    assert ids(b.next_batch("i0", 9)) == [3]


def test_slots_spread_over_instances_lowest_index_first():
    """Rule: a new sequence takes the free slot with the lowest index, on any
    instance; each instance batches only its own slots."""
    b = direct(instances=("i0", "i1"), slots=2)
    for c in (1, 2, 3):
        b.enqueue(req(c, start=True), 0)
    assert b.assigned[1].instance == "i0" and b.assigned[1].index == 0
    assert b.assigned[2].instance == "i1" and b.assigned[2].index == 0
    assert b.assigned[3].instance == "i0" and b.assigned[3].index == 1
    assert ids(b.next_batch("i0", 1)) == [1, 3]
    assert ids(b.next_batch("i1", 1)) == [2]


def test_errors_word_for_word():
    """Rule: Triton's errors for no START on an unknown id, a missing correlation id,
    and a batch of more than one."""
    b = direct()
    with pytest.raises(InferError) as e:
        b.enqueue(req(5), 0)
    assert e.value.code == ErrorCode.INVALID_ARG
    assert e.value.message == ("inference request for sequence 5 to model 'acc' must "
                               "specify the START flag on the first request of the sequence")
    with pytest.raises(InferError) as e:
        b.enqueue(req("abc"), 0)
    assert "for sequence abc to model" in e.value.message
    for missing in (0, ""):
        with pytest.raises(InferError) as e:
            b.enqueue(req(missing, start=True), 0)
        assert e.value.message == ("inference request to model 'acc' must specify a "
                                   "non-zero or non-empty correlation ID")
    with pytest.raises(InferError) as e:
        b.enqueue(req(5, start=True, shape=(2, 1), batch_size=2), 0)
    assert e.value.message == ("inference request to model 'acc' must specify batch-size "
                               "1 due to requirements of sequence batcher")
    with pytest.raises(InferError) as e:
        b.enqueue(req(5, start=True), 0, accepting=False)
    assert e.value.code == ErrorCode.UNAVAILABLE


def test_string_and_integer_ids_are_different_sequences():
    """Rule: string correlation ids are ids of their own; "1" is not 1."""
    b = direct()
    b.enqueue(req("1", start=True), 0)
    with pytest.raises(InferError):
        b.enqueue(req(1), 0)
    b.enqueue(req("1", end=True), 0)
    assert ids(b.next_batch("i0", 1)) == ["1"]
    assert ids(b.next_batch("i0", 2)) == ["1"]


def test_start_on_active_id_goes_on_in_its_slot():
    """Rule: START on an id that is active ends the old sequence: the new one goes on
    in the same slot (its START resets the state there)."""
    b = direct()
    b.enqueue(req(4, start=True), 0)
    b.enqueue(req(4, start=True), 1)
    assert len(b.assigned) == 1 and b.assigned[4].index == 0
    b.next_batch("i0", 2)
    batch = b.next_batch("i0", 3)
    assert batch.slots == [0] and batch.requests[0].req.sequence_start


def test_idle_sequence_releases_its_slot():
    """Rule: max_sequence_idle_microseconds releases an idle sequence's slot to the
    backlog; its later requests need START again."""
    b = direct(slots=1, idle_ns=100 * MS)
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(2, start=True), 10 * MS)  # backlogged
    assert ids(b.next_batch("i0", 10 * MS)) == [1]
    assert b.next_deadline() == 100 * MS
    assert b.reap(99 * MS) == []
    assert b.reap(100 * MS) == [1]
    assert ids(b.next_batch("i0", 101 * MS)) == [2]  # it took the released slot
    with pytest.raises(InferError) as e:
        b.enqueue(req(1), 102 * MS)
    assert "must specify the START flag" in e.value.message


def test_idle_release_runs_what_was_queued_first():
    """Rule: requests a sequence queued before it went idle still run."""
    b = direct(slots=1, idle_ns=100 * MS)
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(1), 0)
    assert b.reap(200 * MS) == [1]
    assert len(ids(b.next_batch("i0", 200 * MS))) == 1
    assert len(ids(b.next_batch("i0", 200 * MS))) == 1
    assert b.next_batch("i0", 200 * MS) is None
    assert b._free  # the slot is free again


def test_minimum_slot_utilization_and_queue_delay():
    """Rule (direct): with minimum_slot_utilization and max_queue_delay, a batch waits
    until enough slots are ready or the oldest request waited the delay."""
    b = direct(slots=4, delay_ns=10 * MS, min_slot_utilization=0.5)
    b.enqueue(req(1, start=True), 0)
    assert b.next_batch("i0", 1 * MS) is None
    assert b.next_deadline() == 10 * MS + 1
    assert ids(b.next_batch("i0", 10 * MS + 1)) == [1]
    b.enqueue(req(2, start=True), 20 * MS)
    b.enqueue(req(3, start=True), 20 * MS)
    assert ids(b.next_batch("i0", 20 * MS)) == [2, 3]  # 2 of 4 slots: enough


def test_unequal_shapes_get_a_filler_row():
    """Rule (direct): a request whose shape differs from the batch's waits, its row is
    a filler, when the model does not allow ragged batches."""
    b = direct(shape_key=lambda q: tuple(q.req.inputs[0].shape))
    b.enqueue(req(1, start=True, shape=(1, 2)), 0)
    b.enqueue(req(2, start=True, shape=(1, 3)), 0)
    batch = b.next_batch("i0", 1)
    assert ids(batch) == [1] and batch.fillers == [1]
    assert ids(b.next_batch("i0", 2)) == [2]


def test_oldest_batches_candidates_oldest_first_one_request_each():
    """Rule (oldest): batches over candidate sequences, oldest first, never two
    requests of one sequence in one batch; the next waits until the previous ran."""
    b = oldest(candidates=4, max_batch_size=4)
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(1), 1)
    b.enqueue(req(2, start=True), 2)
    b.enqueue(req(3, start=True), 3)
    batch = b.next_batch("i0", 10)
    assert ids(batch) == [1, 2, 3] and batch.fillers == []
    assert b.next_batch("i0", 11) is None  # sequence 1's second request must wait
    b.batch_done("i0", batch.slots)
    assert ids(b.next_batch("i0", 12)) == [1]


def test_oldest_max_candidates_backlog_and_max_batch():
    """Rule (oldest): at most max_candidate_sequences per instance; others wait in the
    backlog; a batch holds at most max_batch_size; a slot freed by an END goes to the
    backlog at once, but its first request waits until the END has run."""
    b = oldest(candidates=2, max_batch_size=1)
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(2, start=True), 1)
    b.enqueue(req(3, start=True), 2)
    assert b.backlogged() == 1
    first = b.next_batch("i0", 3)
    assert ids(first) == [1]
    b.batch_done("i0", first.slots)
    b.enqueue(req(1, end=True), 4)
    assert ids(b.next_batch("i0", 5)) == [2]
    end = b.next_batch("i0", 6)
    assert ids(end) == [1]
    # sequence 1 ended: its slot went to sequence 3, which waits for that batch
    assert b.assigned[3].index == end.slots[0]
    assert b.next_batch("i0", 7) is None
    b.batch_done("i0", end.slots)
    assert ids(b.next_batch("i0", 8)) == [3]


def test_oldest_queue_delay_and_preferred_size():
    """Rule (oldest): max_queue_delay_microseconds holds a partial batch; a preferred
    batch size sends it at once."""
    b = oldest(candidates=4, max_batch_size=4, delay_ns=10 * MS, preferred_batch_sizes=[2])
    b.enqueue(req(1, start=True), 0)
    assert b.next_batch("i0", 1 * MS) is None
    assert b.next_deadline() == 10 * MS
    b.enqueue(req(2, start=True), 2 * MS)
    assert ids(b.next_batch("i0", 2 * MS)) == [1, 2]


def test_backlog_hold_hook():
    """Rule: TRITONSERVER_DELAY_SCHEDULER / _BACKLOG_DELAY_SCHEDULER hold the first
    batch until that many requests sit in the slots and in the backlog."""
    b = direct(slots=1, hold=SchedulerHold(1, 2))
    b.enqueue(req(1, start=True), 0)
    b.enqueue(req(2, start=True), 0)
    assert b.next_batch("i0", 1) is None
    b.enqueue(req(3, start=True), 0)
    assert ids(b.next_batch("i0", 2)) == [1]


def test_remove_keeps_the_end():
    """Rule: a cancelled END still ends its sequence, so its slot is freed."""
    b = direct(slots=1)
    b.enqueue(req(1, start=True), 0)
    b.next_batch("i0", 0)
    end = req(1, end=True)
    b.enqueue(end, 1)
    b.enqueue(req(2, start=True), 1)
    assert b.remove(lambda r: r is end) == [end]
    assert ids(b.next_batch("i0", 2)) == [2]


def test_backlogged_sequence_times_out_whole():
    """Rule: a backlogged sequence whose request timeout runs out before it gets a
    slot is rejected whole (Triton: "timeout of the corresponding sequence has been
    expired"); the others keep their place."""
    b = direct(slots=1)
    b.enqueue(req(1, start=True), 0)
    timed = req(2, start=True, timeout_us=1000)
    b.enqueue(timed, 0)
    second = req(2)
    b.enqueue(second, 10)
    b.enqueue(req(3, start=True), 20)
    assert b.next_deadline() == 1 * MS
    assert b.expired(1 * MS - 1) == []
    assert b.expired(1 * MS) == [timed, second]
    assert b.backlogged() == 1
    with pytest.raises(InferError):  # sequence 2 is unknown now
        b.enqueue(req(2), 2 * MS)


def test_the_queue_delay_counts_from_when_the_frontend_accepted_the_request():
    """Rule (both strategies, as the dynamic batcher): max_queue_delay counts from the
    request's start_ns, not from its arrival in the scheduler; the statistics' queue
    time still starts at the enqueue."""
    b = direct(slots=4, delay_ns=10 * MS, min_slot_utilization=0.5)
    r = req(1, start=True, accepted_ns=93 * MS)
    b.enqueue(r, 100 * MS)  # 7 ms after the frontend took it
    assert r.queue_ns == 100 * MS
    assert b.next_batch("i0", 101 * MS) is None
    assert b.next_deadline() == 103 * MS + 1  # not 110 ms
    assert ids(b.next_batch("i0", 103 * MS + 1)) == [1]

    b = oldest(candidates=4, max_batch_size=4, delay_ns=10 * MS)
    b.enqueue(req(1, start=True, accepted_ns=95 * MS), 100 * MS)
    assert b.next_batch("i0", 101 * MS) is None
    assert b.next_deadline() == 105 * MS
    assert ids(b.next_batch("i0", 105 * MS)) == [1]
    # no start time given (0), or one from a clock ahead of ours: the enqueue counts
    b = oldest(candidates=4, max_batch_size=4, delay_ns=10 * MS)
    b.enqueue(req(2, start=True, accepted_ns=0), 100 * MS)
    b.enqueue(req(3, start=True, accepted_ns=200 * MS), 100 * MS)
    assert b.next_deadline() == 110 * MS
