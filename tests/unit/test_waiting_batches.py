"""workers/waiting.py: a request sent to wait at its busy instance's worker is still
queued for its client, so a cancel or its frontend's end takes it out before it starts,
as the scheduler's queue would; an emptied batch is over at once and skipped later."""

from shm.messages.frontend import InferRequest
from shm.messages.worker import ExecuteBatch
from workers.waiting import WaitingBatches


def _batch(batch_id, *requests):
    return ExecuteBatch(batch_id, "m/1/m_0#1",
                        [InferRequest(i, fe, "m", 1, []) for fe, i in requests], ahead=True)


def test_a_cancelled_request_is_left_out_and_an_emptied_batch_is_over_once():
    w = WaitingBatches()
    one, two = _batch(1, ("fe0", 7)), _batch(2, ("fe0", 8), ("fe1", 8))
    for b in (one, two, one):  # seen twice (a model's pump, then its turn): once
        w.arrived(b)
    assert w.cancel("fe0", 7) == (one, [0])  # its only request: over now
    assert w.cancel("fe0", 7) is None  # not waiting any more
    assert w.cancel("fe1", 8) == (None, [])  # the same id from another frontend
    w.arrived(one)  # read again when its turn comes: still over
    assert w.start(one) is None
    kept, taken = w.start(two)
    assert [(r.reply_to, r.id) for r in kept.requests] == [("fe0", 8)] and taken == [1]
    assert w.cancel("fe0", 8) is None  # started: a running model is told instead


def test_a_gone_frontends_requests_are_taken_out_without_an_answer():
    w = WaitingBatches()
    mixed, alone = _batch(1, ("fe0", 1), ("fe1", 1)), _batch(2, ("fe1", 2))
    w.arrived(mixed)
    w.arrived(alone)
    assert w.peer_gone("fe1") == [(alone, [0])]
    kept, taken = w.start(mixed)
    assert [r.reply_to for r in kept.requests] == ["fe0"] and taken == [1]
    assert w.start(alone) is None


def test_a_batch_nobody_touched_starts_as_it_came():
    w = WaitingBatches()
    b = _batch(1, ("fe0", 1))
    w.arrived(b)
    assert w.start(b) == (b, [])
    assert w.start(_batch(9, ("fe0", 2))) == (_batch(9, ("fe0", 2)), [])  # never seen


def _direct(frontend, rid):
    """A request a frontend sent under its deep lease, behind another: its batch id is
    its request id, which only its frontend's inbox makes unique."""
    return ExecuteBatch(rid, "m/1/m_0#1", [InferRequest(rid, frontend, "m", 1, [])],
                        ahead=True, direct=True, lease=3)


def test_a_deep_lease_batch_is_named_by_its_frontend_and_request():
    w = WaitingBatches()
    scheduled, direct = _batch(5, ("fe0", 1)), _direct("fe0", 5)  # the same batch id
    w.arrived(scheduled)
    w.arrived(direct)
    assert w.cancel("fe0", 5) == (direct, [0])
    assert w.start(scheduled) == (scheduled, [])  # untouched by the other's cancel
    assert w.start(direct) is None


def test_a_deep_lease_batch_handed_on_is_forgotten_unless_it_was_taken_out():
    """A lease that ended before its turn hands the batch on to the scheduler: one
    that a cancel emptied meanwhile was answered already, and is not handed on."""
    w = WaitingBatches()
    kept, cancelled = _direct("fe0", 1), _direct("fe0", 2)
    w.arrived(kept)
    w.arrived(cancelled)
    w.cancel("fe0", 2)
    assert w.forget(kept) is False and w.forget(cancelled) is True
    assert w.cancel("fe0", 1) is None  # not waiting here any more
    assert w.start(cancelled) == (cancelled, [])  # forgotten: as it came
