"""The sequence batcher's slots, backlog, idle release and backlog timeout, in the
scheduler's loop (tests/loop/rig.py), for the accumulator models of
tests/models_sequence. What the scheduler decides shows in each ExecuteBatch: the
slot of every request and the not-ready filler slots below the highest one; the
worker turns those into the START/READY vectors and the state (which e2e
tests/e2e/test_sequence.py still checks through the models' outputs)."""

import asyncio

from tests.loop.rig import DEADLINE_S, ids, run
from tests.models_sequence.repo import build

TIMED_OUT = "timeout of the corresponding sequence has been expired"


def _repo(tmp_path, *models: str):
    return build(tmp_path, models)


def _step(rig, model, corrid, start=False, end=False, **kw):
    return rig.send(model, cols=1, inputs=("INPUT",), sequence_id=corrid,
                    sequence_start=start, sequence_end=end, **kw)


async def _one_batch(rig):
    """The next batch the workers get, taken; with its worker."""
    (worker, batch), = await rig.batches_sent(1)
    rig.take_batches()
    return worker, batch


async def _run_alone(rig, fut, slot: int, fillers=(), step=False):
    """`fut`'s request (or with `step`, the one request an ensemble made of it) runs
    alone in `slot`, behind `fillers`; it is answered."""
    worker, batch = await _one_batch(rig)
    assert len(batch.requests) == 1
    if not step:
        assert ids(batch) == [fut.request_id]
    assert (batch.slots, batch.fillers) == ([slot], list(fillers))
    worker.finish(batch)
    reply = await asyncio.wait_for(fut, DEADLINE_S)
    assert not reply.error, reply.error
    return batch


def _pending(rig, model: str) -> int:
    """What nv_inference_pending_request_count shows for `model`."""
    mv, = [mv for mv in rig.server.manager.ready_versions() if mv.name == model]
    return mv.scheduler.pending


async def _no_batch(rig):
    await rig.settle()
    assert rig.batches == []


def test_seed_timeline_slots_and_fillers(tmp_path):
    """Rule (direct): a sequence keeps its slot; a batch spans slots 0..highest ready,
    an empty slot below is a not-ready filler; START reaches the worker only on a
    sequence's first request. (Was e2e test_sequence.py::test_seed_timeline[grpc];
    [http] stays e2e, proving the worker's START/READY vectors and state.)"""
    async def test(rig):
        a, b = 1001, 1002
        batch = await _run_alone(rig, _step(rig, "seq_acc", a, start=True), 0)
        assert batch.requests[0].sequence_start
        await _run_alone(rig, _step(rig, "seq_acc", b, start=True), 1, fillers=[0])
        batch = await _run_alone(rig, _step(rig, "seq_acc", a), 0)
        assert not batch.requests[0].sequence_start
        await _run_alone(rig, _step(rig, "seq_acc", b, end=True), 1, fillers=[0])
        await _run_alone(rig, _step(rig, "seq_acc", a, end=True), 0)
    run(_repo(tmp_path, "seq_acc"), test)


def test_two_starts_in_one_batch(tmp_path):
    """Rule (direct): two sequences started together run in one batch, each in its own
    slot, both START, no filler; after it each goes on alone in its own slot, slot 1
    behind a not-ready filler. (Was e2e test_sequence.py::test_two_starts_in_one_batch,
    which needed its own server held by TRITONSERVER_DELAY_SCHEDULER: here the first
    batch waits on the fake worker instead.)"""
    async def test(rig):
        # both are sent in one pass of the loop, so they are queued together
        first = [_step(rig, "seq_acc", 91, start=True), _step(rig, "seq_acc", 92, start=True)]
        worker, batch = await _one_batch(rig)
        assert ids(batch) == [f.request_id for f in first]
        assert (batch.slots, batch.fillers) == ([0, 1], [])
        assert all(r.sequence_start for r in batch.requests)
        worker.finish(batch)
        await asyncio.gather(*first)
        await _run_alone(rig, _step(rig, "seq_acc", 91, end=True), 0)
        await _run_alone(rig, _step(rig, "seq_acc", 92, end=True), 1, fillers=[0])
    run(_repo(tmp_path, "seq_acc"), test)


def test_backlogged_sequence_gets_the_freed_slot(tmp_path):
    """Rule: with every slot taken a new sequence waits in the backlog (nothing runs,
    the statistics count it pending), and gets the slot once the slot's sequence
    ends, with its START. (Was e2e
    test_sequence.py::test_backlogged_sequence_gets_the_freed_slot[http, grpc].)"""
    async def test(rig):
        a, b = 4001, 4002
        await _run_alone(rig, _step(rig, "seq_acc_1slot", a, start=True), 0)
        waiting = _step(rig, "seq_acc_1slot", b, start=True)
        await _no_batch(rig)
        assert _pending(rig, "seq_acc_1slot") == 1
        assert not waiting.done()
        await _run_alone(rig, _step(rig, "seq_acc_1slot", a, end=True), 0)
        batch = await _run_alone(rig, waiting, 0)
        assert batch.requests[0].sequence_id == b and batch.requests[0].sequence_start
        await _run_alone(rig, _step(rig, "seq_acc_1slot", b, end=True), 0)
    run(_repo(tmp_path, "seq_acc_1slot"), test)


def test_idle_sequence_loses_its_slot(tmp_path):
    """Rule: max_sequence_idle_microseconds releases an idle sequence's slot: a
    backlogged sequence gets it, and the idle one's next request without START is
    refused with Triton's message. (Was e2e
    test_sequence.py::test_idle_sequence_loses_its_slot[http, grpc].)"""
    async def test(rig):
        a, b = 5001, 5002
        await _run_alone(rig, _step(rig, "seq_acc_idle", a, start=True), 0)
        waiting = _step(rig, "seq_acc_idle", b, start=True, end=True)
        await _no_batch(rig)
        await rig.until(lambda: rig.timer.deadline, "the idle deadline")
        rig.timer.fire()
        await _run_alone(rig, waiting, 0)
        reply = await asyncio.wait_for(_step(rig, "seq_acc_idle", a), DEADLINE_S)
        assert reply.error.message == (f"inference request for sequence {a} to model "
                                       "'seq_acc_idle' must specify the START flag on the "
                                       "first request of the sequence")
        await _run_alone(rig, _step(rig, "seq_acc_idle", a, start=True, end=True), 0)
    run(_repo(tmp_path, "seq_acc_idle"), test)


def test_backlog_timeout(tmp_path):
    """Rule: a sequence whose request timeout runs out in the backlog is refused with
    Triton's message, and the sequence holding the slot goes on. (Was e2e
    test_sequence.py::test_backlog_timeout[http, grpc].)"""
    async def test(rig):
        a, b = 8001, 8002
        await _run_alone(rig, _step(rig, "seq_acc_1slot", a, start=True), 0)
        late = _step(rig, "seq_acc_1slot", b, start=True, timeout_us=20_000)
        await _no_batch(rig)
        await rig.until(lambda: rig.timer.deadline, "the backlog timeout")
        rig.timer.fire()
        reply = await asyncio.wait_for(late, DEADLINE_S)
        assert reply.error.message == TIMED_OUT
        await _no_batch(rig)
        await _run_alone(rig, _step(rig, "seq_acc_1slot", a, end=True), 0)
    run(_repo(tmp_path, "seq_acc_1slot"), test)


def test_start_on_active_sequence_starts_over_in_its_slot(tmp_path):
    """Rule: START on an id whose sequence is active starts it over in the same slot,
    with START for the worker to reset the state; a new id still gets the next slot.
    (Was e2e test_sequence.py::test_start_on_active_sequence_starts_over[grpc]; [http]
    stays, proving the state starts over.)"""
    async def test(rig):
        await _run_alone(rig, _step(rig, "seq_acc", 7001, start=True), 0)
        batch = await _run_alone(rig, _step(rig, "seq_acc", 7001, start=True), 0)
        assert batch.requests[0].sequence_start
        await _run_alone(rig, _step(rig, "seq_acc", 7002, start=True), 1, fillers=[0])
        await _run_alone(rig, _step(rig, "seq_acc", 7001, end=True), 0)
    run(_repo(tmp_path, "seq_acc"), test)


ENS_SEQ = """name: "ens_seq"
platform: "ensemble"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "seq_acc" model_version: -1
  input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "SUM" } } ] }
"""


def test_ensemble_passes_sequences_to_its_stateful_step(tmp_path):
    """Rule: an ensemble request's correlation id and START/END flags reach its
    stateful step, so interleaved sequences through the ensemble keep their own slots.
    (Was e2e test_sequence.py::test_ensemble_passes_sequences_to_its_stateful_step
    [grpc]; [http] stays, with the ONNX step's sums.)"""
    async def test(rig):
        def through(corrid, start=False, end=False):
            return rig.send("ens_seq", cols=1, inputs=("IN",), sequence_id=corrid,
                            sequence_start=start, sequence_end=end)
        for k in range(3):
            for corrid, slot in ((70001, 0), (70002, 1)):
                batch = await _run_alone(rig, through(corrid, k == 0, k == 2), slot,
                                         fillers=[0] if slot else [], step=True)
                req, = batch.requests
                assert (req.model, req.sequence_id, req.sequence_start,
                        req.sequence_end) == ("seq_acc", corrid, k == 0, k == 2)
    repo = _repo(tmp_path, "seq_acc")
    (repo / "ens_seq" / "1").mkdir(parents=True)
    (repo / "ens_seq" / "config.pbtxt").write_text(ENS_SEQ)
    run(repo, test)
