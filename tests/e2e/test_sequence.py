"""The sequence batcher end to end, over HTTP and gRPC with the official clients.

The accumulator models (tests/models_sequence) keep their running sum as implicit
state, which the worker hands them as ACC_IN and takes back from ACC_OUT, so a wrong
slot, a lost state or a state that leaks between sequences shows up in the sums. The
python model also reports the START and READY vectors of the batch it ran in, which
is how the slot layout (rows, not-ready fillers) reaches the model. Which slot, batch
or backlog the scheduler picks is checked in its loop (tests/loop/test_sequence.py).
"""

import concurrent.futures as cf
import queue

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import ServerProcess
from tests.models_sequence.repo import build

pytestmark = pytest.mark.e2e

# the slots, backlog, idle release and backlog timeout of seq_acc, seq_acc_1slot and
# seq_acc_idle are the scheduler's: tests/loop/test_sequence.py
MODELS = ["seq_acc", "seq_acc_oldest", "seq_acc_string",
          "seq_acc_onnx", "seq_acc_onnx_oldest", "seq_acc_torch", "seq_acc_torch_oldest", "seq_acc_init"]


# an ensemble whose one step is the ONNX accumulator: the sequence id and flags of the
# ensemble's request must reach the stateful step (Triton passes them on)
ENS_SEQ = """name: "ens_seq"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "seq_acc_onnx" model_version: -1
  input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "SUM" } } ] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = build(tmp_path_factory.mktemp("seq-repo"), MODELS)
    (repo / "ens_seq" / "1").mkdir(parents=True)
    (repo / "ens_seq" / "config.pbtxt").write_text(ENS_SEQ)
    srv = ServerProcess(repo, frontends=2, log_dir=tmp_path_factory.mktemp("seq"))
    yield from srv.serve()


def step(srv, protocol, model, corrid, value, start=False, end=False, outputs=None):
    """One request of a sequence; returns the response as {output name: array}."""
    x = np.array([[value]], dtype=np.int32)
    name = "INPUT__0" if "torch" in model else "INPUT"
    r = client(srv, protocol).infer(model, [infer_input(protocol, name, x, "INT32")],
                                    sequence_id=corrid, sequence_start=start,
                                    sequence_end=end)
    names = outputs or ["OUTPUT", "START_VEC", "READY_VEC", "CORRID_OUT", "CALL"]
    return {n: r.as_numpy(n) for n in names}


def total(out) -> int:
    return int(out["OUTPUT"].reshape(-1)[0])


def test_seed_timeline(server):
    """Rule (direct): a sequence keeps its slot; a batch spans slots 0..highest ready,
    an empty slot below is a not-ready filler (READY 0, START 0); START is 1 only on
    a sequence's first request; the state is the sequence's own. (The slots the
    scheduler picks: tests/loop/test_sequence.py; here the worker's vectors and state
    as a client sees them.)"""
    protocol, a, b = "http", 1001, 1002
    r = step(server, protocol, "seq_acc", a, 1, start=True)
    assert total(r) == 1
    assert r["START_VEC"].tolist() == [[1]] and r["READY_VEC"].tolist() == [[1]]
    assert r["CORRID_OUT"].reshape(-1)[0] in (str(a).encode(), str(a))
    r = step(server, protocol, "seq_acc", b, 10, start=True)
    assert total(r) == 10
    # b owns slot 1: slot 0 (a's) has nothing ready, so it runs as a filler row
    assert r["START_VEC"].tolist() == [[0, 1]] and r["READY_VEC"].tolist() == [[0, 1]]
    r = step(server, protocol, "seq_acc", a, 2)
    assert total(r) == 3
    assert r["START_VEC"].tolist() == [[0]] and r["READY_VEC"].tolist() == [[1]]
    r = step(server, protocol, "seq_acc", b, 20, end=True)
    assert total(r) == 30
    assert r["START_VEC"].tolist() == [[0, 0]] and r["READY_VEC"].tolist() == [[0, 1]]
    r = step(server, protocol, "seq_acc", a, 3, end=True)
    assert total(r) == 6


def _run_sequences(srv, protocol, model, base, count, steps, outputs=("OUTPUT",)):
    """`count` sequences of `steps` requests each, from concurrent threads; each
    checks its own running sum."""
    def one(i):
        corrid = base + i
        want = 0
        for k in range(steps):
            value = (i + 1) * 100 + k
            want += value
            out = step(srv, protocol, model, corrid, value, start=k == 0,
                       end=k == steps - 1, outputs=list(outputs))
            assert int(out[outputs[0]].reshape(-1)[0]) == want, (corrid, k)
        return want

    with cf.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["seq_acc", "seq_acc_oldest", "seq_acc_onnx",
                                   "seq_acc_onnx_oldest", "seq_acc_torch",
                                   "seq_acc_torch_oldest"])
def test_interleaved_sequences(server, protocol, model):
    """Rule: interleaved sequences each see only their own state, on direct (slots,
    backlog) and oldest (candidates), python, ONNX and TorchScript models with
    implicit state."""
    base = 10_000 + 1000 * MODELS.index(model) + (0 if protocol == "http" else 500)
    outputs = ["OUTPUT__0"] if "torch" in model else ["OUTPUT"]
    sums = _run_sequences(server, protocol, model, base, 6, 5, outputs)
    assert sums == [sum((i + 1) * 100 + k for k in range(5)) for i in range(6)]


def test_ensemble_passes_sequences_to_its_stateful_step(server):
    """Rule: an ensemble's correlation id and START/END flags flow to a stateful step,
    so interleaved sequences through the ensemble keep their own sums. (Over HTTP
    only: tests/loop/test_sequence.py proves the flags and slots the step gets.)"""
    protocol, base = "http", 70_000

    def one(i):
        want = 0
        for k in range(4):
            value = (i + 1) * 10 + k
            want += value
            x = np.array([[value]], dtype=np.int32)
            r = client(server, protocol).infer(
                "ens_seq", [infer_input(protocol, "IN", x, "INT32")],
                sequence_id=base + i, sequence_start=k == 0, sequence_end=k == 3)
            assert int(r.as_numpy("SUM").reshape(-1)[0]) == want, (i, k)
        return want

    with cf.ThreadPoolExecutor(3) as pool:
        assert list(pool.map(one, range(3))) == [
            sum((i + 1) * 10 + k for k in range(4)) for i in range(3)]


def test_sequences_over_one_grpc_stream(server):
    """Rule: the gRPC stream carries sequence_id/start/end per request, as Triton's
    clients send sequences; two interleaved sequences on one stream keep their own
    sums, and responses come back in order."""
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        want = {80_001: 0, 80_002: 0}
        for k in range(4):
            for corrid in want:
                value = corrid % 10 * 100 + k
                want[corrid] += value
                x = np.array([[value]], dtype=np.int32)
                c.async_stream_infer("seq_acc", [infer_input("grpc", "INPUT", x, "INT32")],
                                     sequence_id=corrid, sequence_start=k == 0,
                                     sequence_end=k == 3, request_id=f"{corrid}-{k}")
                result, error = results.get(timeout=30)
                assert error is None, error
                assert result.get_response().id == f"{corrid}-{k}"
                assert total({"OUTPUT": result.as_numpy("OUTPUT")}) == want[corrid]
    finally:
        c.stop_stream()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["seq_acc_onnx", "seq_acc_torch"])
def test_framework_start_control(server, protocol, model):
    """Rule: the worker makes the START control tensor of the batch for ONNX and
    TorchScript models (int32_false_true), 1 on the first request only."""
    corrid = 3001 + MODELS.index(model) * 10 + (0 if protocol == "http" else 1)
    names = ["OUTPUT__0", "START_OUT__2"] if "torch" in model else ["OUTPUT", "START_OUT"]
    outs = [step(server, protocol, model, corrid, v, start=i == 0, end=i == 2,
                 outputs=names) for i, v in enumerate((5, 6, 7))]
    assert [int(o[names[1]].flat[0]) for o in outs] == [1, 0, 0]
    assert [int(o[names[0]].flat[0]) for o in outs] == [5, 11, 18]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_ids(server, protocol):
    """Rule: string correlation ids work on a model whose CORRID is TYPE_STRING, and
    the CORRID control carries the string."""
    sid = f"seq-{protocol}"
    r = step(server, protocol, "seq_acc_string", sid, 4, start=True)
    assert r["CORRID_OUT"].reshape(-1)[0] in (sid.encode(), sid)
    r = step(server, protocol, "seq_acc_string", sid, 5, end=True)
    assert total(r) == 9


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input(server, protocol):
    """Rule: Triton's errors, and the server keeps serving: batch size 2, a string id
    on a uint64 model, no correlation id, no START on an unknown sequence."""
    c = client(server, protocol)
    x2 = np.array([[1], [2]], dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        c.infer("seq_acc", [infer_input(protocol, "INPUT", x2, "INT32")], sequence_id=77,
                sequence_start=True)
    assert ("inference request to model 'seq_acc' must specify batch-size 1 due to "
            "requirements of sequence batcher") in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        step(server, protocol, "seq_acc", "abc", 1, start=True)
    assert ("sequence batching control 'CORRID' data-type is 'BYTES', but model "
            "'seq_acc' expects 'UINT64'") in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        step(server, protocol, "seq_acc", 0, 1, start=True)
    assert ("inference request to model 'seq_acc' must specify a non-zero or non-empty "
            "correlation ID") in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        step(server, protocol, "seq_acc", 987654, 1)
    assert ("inference request for sequence 987654 to model 'seq_acc' must specify the "
            "START flag on the first request of the sequence") in e.value.message()
    corrid = 6001 if protocol == "http" else 6002
    assert total(step(server, protocol, "seq_acc", corrid, 8, start=True, end=True)) == 8


def test_start_on_active_sequence_starts_over(server):
    """Rule: START on an id whose sequence is active ends the old sequence (Triton
    logs a warning): the new one starts from the initial state in the same slot. (Over
    HTTP only: tests/loop/test_sequence.py proves the slot and the START it gets.)"""
    protocol, corrid = "http", 7001
    assert total(step(server, protocol, "seq_acc", corrid, 5, start=True)) == 5
    assert total(step(server, protocol, "seq_acc", corrid, 1, start=True)) == 1
    assert total(step(server, protocol, "seq_acc", corrid, 2, end=True)) == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_initial_state_from_data_file(server, protocol):
    """Rule: initial_state data_file (<model>/initial_state/acc.bin holds 100) is the
    state every sequence starts from."""
    corrid = 9001 if protocol == "http" else 9002
    assert total(step(server, protocol, "seq_acc_init", corrid, 1, start=True)) == 101
    assert total(step(server, protocol, "seq_acc_init", corrid, 2, end=True)) == 103
    assert total(step(server, protocol, "seq_acc_init", corrid, 5, start=True,
                      end=True)) == 105


def test_ensemble_responses_carry_the_sequence_fields_on_a_grpc_stream(server):
    """Rule (as Triton 2.51 answers, compared side by side): every response of an
    ensemble carries the parameters sequence_id, sequence_start and sequence_end it
    ran with (int64 or string id, bool flags), here over ModelStreamInfer; a plain
    model's response has none of them."""
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        flags = [(True, False), (False, False), (False, True)]
        for k, (start, end) in enumerate(flags):
            x = np.array([[k + 1]], dtype=np.int32)
            c.async_stream_infer("ens_seq", [infer_input("grpc", "IN", x, "INT32")],
                                 request_id=str(k), sequence_id=90_001,
                                 sequence_start=start, sequence_end=end)
        got = []
        for _ in flags:
            result, error = results.get(timeout=30)
            assert error is None, error
            p = result.get_response().parameters
            got.append((p["sequence_id"].int64_param, p["sequence_start"].bool_param,
                        p["sequence_end"].bool_param))
        assert got == [(90_001, s, e) for s, e in flags]
        x = np.array([[1]], dtype=np.int32)
        c.async_stream_infer("ens_seq", [infer_input("grpc", "IN", x, "INT32")],
                             sequence_id="s-9", sequence_start=True, sequence_end=True)
        result, error = results.get(timeout=30)
        assert error is None, error
        assert result.get_response().parameters["sequence_id"].string_param == "s-9"
        c.async_stream_infer("seq_acc", [infer_input("grpc", "INPUT", x, "INT32")],
                             sequence_id=90_002, sequence_start=True, sequence_end=True)
        result, error = results.get(timeout=30)
        assert error is None, error
        assert "sequence_id" not in result.get_response().parameters
    finally:
        c.stop_stream()
