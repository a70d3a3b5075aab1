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
