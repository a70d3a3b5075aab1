"""The worker's half of the sequence batcher (workers/sequence.py): control tensors,
filler rows and the per-slot implicit state, without processes."""

import numpy as np
import pytest

from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.worker import ExecuteBatch
from shm.tensor import TensorRef
from workers.sequence import SequenceContext
from workers.tensors import TensorIO


def _config(max_batch=4, corrid="TYPE_UINT64", kinds=("int32", "fp32", "bool"),
            initial=None):
    controls = []
    for kind, form in zip(("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END",
                           "CONTROL_SEQUENCE_READY"), kinds):
        values = {"int32": {"int32_false_true": [0, 1]},
                  "fp32": {"fp32_false_true": [0.0, 1.0]},
                  "bool": {"bool_false_true": [False, True]}}[form]
        controls.append({"name": kind.split("_")[-1], "control": [{"kind": kind, **values}]})
    controls.append({"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID",
                                                    "data_type": corrid}]})
    state = {"input_name": "ACC_IN", "output_name": "ACC_OUT", "data_type": "TYPE_INT32",
             "dims": ["2"]}
    if initial:
        state["initial_state"] = [initial]
    return {"name": "acc", "max_batch_size": max_batch,
            "sequence_batching": {"control_input": controls, "state": [state]},
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": ["2"]}]}


def _req(i, corrid, start=False, end=False, outputs=None):
    x = np.full((1, 2), i, dtype=np.int32)
    return InferRequest(i, "fe", "acc", 1, [TensorRef("INPUT", "INT32", [1, 2],
                                                      data=x.tobytes())],
                        outputs=outputs, sequence_id=corrid, sequence_start=start,
                        sequence_end=end)



def _inputs(row):
    io = TensorIO.__new__(TensorIO)  # only .input() is used: no arena needed
    return {ref.name: TensorIO.input(io, ref) for ref in row.inputs}


def _accumulate(rows):
    """What the model would do: ACC_OUT = OUTPUT = ACC_IN + INPUT."""
    results = []
    for row in rows:
        t = _inputs(row)
        total = t["ACC_IN"] + t["INPUT"]
        results.append([("OUTPUT", "INT32", total), ("ACC_OUT", "INT32", total)])
    return results


def test_controls_per_row_and_not_ready_filler(tmp_path):
    """Rule: START/END/READY in their int32, fp32 and bool forms, CORRID in its
    data_type; a filler row is READY false, START/END false, CORRID 0, zero inputs."""
    ctx = SequenceContext(_config(), str(tmp_path))
    a, b = _req(1, 11, start=True), _req(2, 12, end=True)
    msg = ExecuteBatch(1, "i", [a, b], slots=[0, 2], fillers=[1])
    rows, order = ctx.rows(msg)
    assert order == [0, -1, 1]
    t = [_inputs(r) for r in rows]
    assert [x["START"].dtype for x in t] == [np.int32] * 3
    assert [int(x["START"].flat[0]) for x in t] == [1, 0, 0]
    assert [float(x["END"].flat[0]) for x in t] == [0.0, 0.0, 1.0]
    assert t[0]["END"].dtype == np.float32 and t[0]["READY"].dtype == np.bool_
    assert [bool(x["READY"].flat[0]) for x in t] == [True, False, True]
    assert [int(x["CORRID"].flat[0]) for x in t] == [11, 0, 12]
    assert t[0]["CORRID"].dtype == np.uint64 and t[0]["CORRID"].shape == (1, 1)
    assert t[1]["INPUT"].tolist() == [[0, 0]]
    assert rows[1].id == -1 and rows[1].sequence_id == 0


def test_state_kept_per_slot_and_reset_by_start(tmp_path):
    """Rule: implicit state starts from the initial state at START, follows the
    sequence in its slot, is not returned unless asked for, and a filler leaves the
    slot's state alone."""
    ctx = SequenceContext(_config(), str(tmp_path))

    def run(reqs, slots, fillers=()):
        msg = ExecuteBatch(1, "i", reqs, slots=slots, fillers=list(fillers))
        rows, order = ctx.rows(msg)
        assert all(any(o.name == "ACC_OUT" for o in r.outputs) for r in rows)
        return ctx.results(msg, rows, order, _accumulate(rows))

    out = run([_req(1, 11, start=True), _req(5, 12, start=True)], [0, 1])
    assert [[n for n, _, _ in r] for r in out] == [["OUTPUT"], ["OUTPUT"]]
    assert [r[0][2].tolist() for r in out] == [[[1, 1]], [[5, 5]]]
    out = run([_req(2, 12)], [1], fillers=[0])
    assert out[0][0][2].tolist() == [[7, 7]]
    out = run([_req(3, 11)], [0])
    assert out[0][0][2].tolist() == [[4, 4]]  # slot 0's state survived the filler
    out = run([_req(3, 11, start=True)], [0])
    assert out[0][0][2].tolist() == [[3, 3]]  # START: back to the initial state


def test_initial_state_from_data_file(tmp_path):
    """Rule: initial_state data_file is read from <model>/initial_state/ (Triton's
    kInitialStateFolder, beside warmup/)."""
    folder = tmp_path / "initial_state"
    folder.mkdir(parents=True)
    (folder / "acc.bin").write_bytes(np.array([40, 50], dtype=np.int32).tobytes())
    initial = {"data_type": "TYPE_INT32", "dims": ["2"], "data_file": "acc.bin",
               "name": "init"}
    ctx = SequenceContext(_config(initial=initial), str(tmp_path))
    msg = ExecuteBatch(1, "i", [_req(1, 11, start=True)], slots=[0])
    rows, order = ctx.rows(msg)
    assert _inputs(rows[0])["ACC_IN"].tolist() == [[40, 50]]
    with pytest.raises(ValueError):
        initial["data_file"] = "missing.bin"
        SequenceContext(_config(initial=initial), str(tmp_path))


def test_string_corrid_and_unbatched_shapes(tmp_path):
    """Rule: a TYPE_STRING CORRID carries the string id; a model that does not batch
    gets controls of shape [1] and states of its dims."""
    ctx = SequenceContext(_config(max_batch=0, corrid="TYPE_STRING"), str(tmp_path))
    msg = ExecuteBatch(1, "i", [_req(1, "seq-a", start=True)], slots=[0])
    rows, _ = ctx.rows(msg)
    t = _inputs(rows[0])
    assert t["CORRID"].tolist() == [b"seq-a"]
    assert t["START"].shape == (1,) and t["ACC_IN"].shape == (2,)


def test_client_requested_outputs_kept(tmp_path):
    """Rule: the outputs the client asked for come back; the state output only if
    asked for by name."""
    ctx = SequenceContext(_config(), str(tmp_path))
    req = _req(1, 11, start=True,
               outputs=[RequestedOutput("OUTPUT"), RequestedOutput("ACC_OUT")])
    msg = ExecuteBatch(1, "i", [req], slots=[0])
    rows, order = ctx.rows(msg)
    out = ctx.results(msg, rows, order, _accumulate(rows))
    assert [n for n, _, _ in out[0]] == ["OUTPUT", "ACC_OUT"]


def test_corrid_narrow_types_take_the_low_bytes(tmp_path):
    """Rule: a 32-bit CORRID gets the id's low 32 bits (Triton copies the first bytes
    of the uint64), never an overflow."""
    ctx = SequenceContext(_config(corrid="TYPE_INT32"), str(tmp_path))
    msg = ExecuteBatch(1, "i", [_req(1, (1 << 40) + 7, start=True)], slots=[0])
    rows, _ = ctx.rows(msg)
    corrid = _inputs(rows[0])["CORRID"]
    assert corrid.dtype == np.int32 and corrid.tolist() == [[7]]
