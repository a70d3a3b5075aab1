"""Ensembles end to end, over HTTP and gRPC: steps of python and ONNX models, a parallel
branch, intermediate tensors passed by reference (the workers' copy counters prove
none is copied), a failing step, an unknown step model, metadata, config, statistics,
client shared memory for ensemble outputs, and decoupled steps (each response runs the
steps after it; the ensemble streams over gRPC and the HTTP streaming routes)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from frontend.http_stream import read_frames
from tests import onnx_models

try:
    from tests import torch_models
except ImportError:  # no torch here: the three-framework ensemble is skipped
    torch_models = None
from tests.e2e import clients
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODELS_ENSEMBLE = ROOT / "tests" / "models_ensemble"
DECOUPLED = ROOT / "tests" / "models_decoupled"
# above the inline limit (64 KiB): tensors travel as shared-memory blocks
BIG = 300_000  # FP32 elements, 1.2 MB

ONNX_IDENTITY = """name: "onnx_identity"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


# python -> TorchScript -> ONNX, one after the other
ENS_THREE = """name: "ens_three"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "py_double" model_version: -1
      input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "T1" } },
    { model_name: "torch_identity" model_version: -1
      input_map { key: "INPUT__0" value: "T1" } output_map { key: "OUTPUT__0" value: "T2" } },
    { model_name: "onnx_identity" model_version: -1
      input_map { key: "INPUT0" value: "T2" } output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""


def build_repository(root: Path) -> Path:
    """tests/models_ensemble plus the ONNX (and TorchScript) steps the tests build."""
    shutil.copytree(MODELS_ENSEMBLE, root, dirs_exist_ok=True)
    shutil.copytree(DECOUPLED / "repeat", root / "repeat")  # ens_repeat's first step
    shutil.copytree(ROOT / "tests" / "models_bls" / "cancel_stream", root / "cancel_stream")
    onnx_models.identity(root / "onnx_identity", dims=("n",), config=ONNX_IDENTITY)
    if torch_models is not None:
        torch_models.identity(root / "torch_identity")
        (root / "ens_three" / "1").mkdir(parents=True)
        (root / "ens_three" / "config.pbtxt").write_text(ENS_THREE)
    return root


def start(tmp_path_factory, name: str, *args: str) -> ServerProcess:
    repo = build_repository(tmp_path_factory.mktemp(f"{name}-models"))
    markers = tmp_path_factory.mktemp(f"{name}-markers")  # py_meet_* meet there
    return ServerProcess([repo], "--exit-on-error=false",
                         "--strict-readiness=false", *args, frontends=2,
                         log_dir=tmp_path_factory.mktemp(f"{name}-logs"),
                         env={"SHMSERVE_GPUS": "0", "SHMSERVE_TEST_MARKER_DIR": str(markers)})


@pytest.fixture(scope="module")
def ens_server(tmp_path_factory):
    yield from start(tmp_path_factory, "ens", "--allow-client-shm=true").serve()


def infer(server, protocol, model, x, outputs=None):
    c = clients.client(server, protocol)
    inp = clients.infer_input(protocol, "IN", x, "FP32")
    requested = [clients.requested(protocol, n) for n in outputs] if outputs else None
    return c.infer(model, [inp], outputs=requested)


def ramp(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32).reshape(1, n)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
@pytest.mark.parametrize("n", [16, BIG])
def test_two_python_steps(ens_server, protocol, n):
    """Rule: an ensemble runs its steps in order of their data: OUT = double(identity(IN)),
    small (inline) and large (shared-memory blocks) alike."""
    x = ramp(n)
    r = infer(ens_server, protocol, "ens_py_chain", x)
    np.testing.assert_array_equal(r.as_numpy("OUT"), 2 * x)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
@pytest.mark.parametrize("n", [16, BIG])
def test_python_and_onnx_steps_with_a_parallel_branch(ens_server, protocol, n):
    """Rule: one intermediate tensor feeds an ONNX step and a python step (a parallel
    branch); both ensemble outputs come back, or only those the client asks for."""
    x = ramp(n)
    r = infer(ens_server, protocol, "ens_mixed", x)
    np.testing.assert_array_equal(r.as_numpy("OUT_ONNX"), x)
    np.testing.assert_array_equal(r.as_numpy("OUT_PY"), 2 * x)
    r = infer(ens_server, protocol, "ens_mixed", x, outputs=["OUT_PY"])
    np.testing.assert_array_equal(r.as_numpy("OUT_PY"), 2 * x)
    assert r.as_numpy("OUT_ONNX") is None


def test_independent_steps_run_at_the_same_time(ens_server):
    """Rule: steps that do not depend on each other run at once: each of the two steps
    answers only while the other runs the same request (they wait for each other's
    marker), so a scheduler running them one after the other fails this. (Over HTTP
    only: the scheduling rule is tests/loop/test_ensemble.py's; this is real workers.)"""
    protocol, token = "http", 1
    x = np.full((1, 4), token, np.float32)
    r = infer(ens_server, protocol, "ens_meet", x)
    np.testing.assert_array_equal(r.as_numpy("OUT_A"), x)
    np.testing.assert_array_equal(r.as_numpy("OUT_B"), x)


@pytest.mark.skipif(torch_models is None, reason="torch is not installed")
@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
@pytest.mark.parametrize("n", [16, BIG])
def test_python_torchscript_and_onnx_steps(ens_server, protocol, n):
    """Rule: steps of the three backends mix in one ensemble, tensors passing from a
    python worker to the TorchScript and ONNX ones (here one device worker)."""
    x = ramp(n)
    r = infer(ens_server, protocol, "ens_three", x)
    np.testing.assert_array_equal(r.as_numpy("OUT"), 2 * x)


def test_a_failing_step_fails_the_request_and_names_it(ens_server):
    """Rule: a step's error fails the ensemble request with Triton's "in ensemble"
    prefix, the failing step's model and its message; the server keeps serving. (Over
    HTTP only: tests/loop/test_ensemble.py has the rule; this is the model's message as
    a client gets it.)"""
    protocol = "http"
    with pytest.raises(InferenceServerException) as e:
        infer(ens_server, protocol, "ens_fail", -np.ones((1, 4), np.float32))
    msg = e.value.message()
    assert msg.startswith("in ensemble 'ens_fail', ")
    assert "model 'py_fail'" in msg and "py_fail refuses negative values" in msg
    r = infer(ens_server, protocol, "ens_fail", np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(r.as_numpy("OUT"), np.ones((1, 4), np.float32))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_an_unknown_step_model_is_a_load_error_and_others_keep_serving(ens_server,
                                                                         protocol):
    """Rule (bad input): an ensemble naming a model no repository has fails to load with
    Triton's reason; a request for it is refused with that reason, and every other
    model serves."""
    c = clients.client(ens_server, protocol)
    assert not c.is_model_ready("ens_unknown")
    with pytest.raises(InferenceServerException) as e:
        infer(ens_server, protocol, "ens_unknown", ramp(4))
    assert ("ensemble ens_unknown contains models that are not available or ambiguous: "
            "no_such_model") in e.value.message()
    assert c.is_server_live()
    assert c.is_model_ready("ens_py_chain")
    np.testing.assert_array_equal(
        infer(ens_server, protocol, "ens_py_chain", ramp(4)).as_numpy("OUT"), 2 * ramp(4))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_metadata_and_config_of_an_ensemble(ens_server, protocol):
    """Rule: metadata and config work for ensembles as Triton prints them (platform
    "ensemble", no instance groups, steps with their maps, the transaction policy
    Triton sets)."""
    c = clients.client(ens_server, protocol)
    assert c.is_model_ready("ens_mixed")
    meta = c.get_model_metadata("ens_mixed")
    config = c.get_model_config("ens_mixed")
    if protocol == "grpc":
        from google.protobuf import json_format
        meta = json_format.MessageToDict(meta, preserving_proto_field_name=True)
        config = json_format.MessageToDict(config.config, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["IN"]
    assert [o["name"] for o in meta["outputs"]] == ["OUT_ONNX", "OUT_PY"]
    assert [list(map(int, o["shape"])) for o in meta["outputs"]] == [[-1, -1], [-1, -1]]
    assert config["platform"] == "ensemble" and config["instance_group"] == []
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["py_identity", "onnx_identity", "py_double"]
    assert steps[1]["input_map"] == {"INPUT0": "T"}
    assert config["model_transaction_policy"] == {"decoupled": False}


def _stats(server, protocol, model):
    c = clients.client(server, protocol)
    if protocol == "http":
        (m,) = c.get_inference_statistics(model)["model_stats"]
        inf = m["inference_stats"]
        return (m["execution_count"], inf["success"]["count"], inf["fail"]["count"],
                inf["compute_infer"]["count"], inf["compute_infer"]["ns"])
    (m,) = c.get_inference_statistics(model).model_stats
    inf = m.inference_stats
    return (m.execution_count, inf.success.count, inf.fail.count, inf.compute_infer.count,
            inf.compute_infer.ns)


def test_statistics_count_the_ensemble_and_its_steps(ens_server):
    """Rule (as Triton 2.51 reports it): an ensemble request is one execution and one
    success of the ensemble, with its steps' compute times summed, and one of each of
    its step models; a failed one is a failure of the ensemble. (Over HTTP only: the
    counts are tests/loop/test_ensemble.py's; this adds the real workers' times.)"""
    protocol = "http"
    before = {m: _stats(ens_server, protocol, m)
              for m in ("ens_py_chain", "py_identity", "py_double", "ens_fail")}
    for _ in range(3):
        infer(ens_server, protocol, "ens_py_chain", ramp(16))
    with pytest.raises(InferenceServerException):
        infer(ens_server, protocol, "ens_fail", -np.ones((1, 4), np.float32))

    def settled():
        now = {m: _stats(ens_server, protocol, m) for m in before}
        grew = {m: tuple(a - b for a, b in zip(now[m], before[m])) for m in now}
        return grew if grew["ens_py_chain"][0] == 3 and grew["py_double"][0] == 3 else None

    grew = wait_until(settled, 30, what="statistics to count every step")
    ens = grew["ens_py_chain"]
    assert ens[:4] == (3, 3, 0, 3) and ens[4] > 0
    assert grew["py_identity"][:2] == (4, 4)  # three chains and the failed request
    assert grew["ens_fail"][:3] == (0, 0, 1)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_an_ensemble_output_goes_straight_into_the_clients_region(ens_server, protocol):
    """Rule: a client shared-memory region for an ensemble output is written by the step
    that makes it; nothing comes back in the response body."""
    c = clients.client(ens_server, protocol)
    x = ramp(BIG)
    name, key = f"ens{uuid.uuid4().hex[:8]}", f"/ens-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, x.nbytes)
    try:
        c.register_system_shared_memory(name, key, x.nbytes)
        out = clients.module(protocol).InferRequestedOutput("OUT")
        out.set_shared_memory(name, x.nbytes)
        r = c.infer("ens_py_chain", [clients.infer_input(protocol, "IN", x, "FP32")],
                    outputs=[out])
        assert r.get_output("OUT") is not None  # described, its bytes not sent
        if protocol == "grpc":
            assert not any(r.get_response().raw_output_contents)
        got = shm.get_contents_as_numpy(handle, np.float32, [1, BIG])
        np.testing.assert_array_equal(got, 2 * x)
        c.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def _copies(srv: ServerProcess, model: str) -> int:
    """Host bytes the model's instances copied, from the summary logged at exit."""
    m = re.search(rf"model '{model}' version 1: .*bytes copied host=(\d+) ", srv.log())
    assert m, f"no summary for {model} in the log"
    return int(m.group(1))


def test_intermediate_tensors_are_never_copied(tmp_path_factory):
    """Rule: an intermediate tensor is written once, by the step that makes it, into
    its worker's arena, and read in place by every step it feeds: each step model's
    workers copy exactly its own outputs' bytes, never its inputs', whichever
    protocol and with a block read by two steps at once. Blocks are all returned:
    the server stops with no shared memory left."""
    srv = start(tmp_path_factory, "ens-copies")
    srv.start()
    x = ramp(BIG)
    rounds = 0
    try:
        for protocol in clients.PROTOCOLS:
            for _ in range(3):
                r = infer(srv, protocol, "ens_mixed", x)
                np.testing.assert_array_equal(r.as_numpy("OUT_PY"), 2 * x)
                rounds += 1
    finally:
        srv.stop_checked()
    # every ensemble output block the clients read came back through the scheduler
    assert "never released" not in srv.log()
    written = rounds * x.nbytes
    assert _copies(srv, "py_identity") == written  # T, once per request
    assert _copies(srv, "onnx_identity") == written  # OUT_ONNX
    assert _copies(srv, "py_double") == written  # OUT_PY


# -- decoupled steps -----------------------------------------------------------------------

T = 60  # seconds: a bound on every wait, never a pace


@pytest.fixture(scope="module")
def dec_server(tmp_path_factory):
    """Its own server, so that its log shows every block of these tests came back."""
    srv = start(tmp_path_factory, "ens-dec")
    yield from srv.serve()
    # the worker warns of arena bytes never released, the scheduler of lent blocks
    assert "never released" not in srv.log()


class Stream(clients.GrpcStream):
    def send(self, model, x, request_id, **params):
        inp = grpcclient.InferInput("IN", list(x.shape), "INT32")
        inp.set_data_from_numpy(x)
        self.client.async_stream_infer(model, [inp], request_id=request_id,
                                       parameters=params or None,
                                       enable_empty_final_response=True)

    def until_final(self):
        return super().until_final(stop_on_error=True)


_final = clients.is_final


@pytest.fixture
def stream(dec_server):
    s = Stream(dec_server)
    yield s
    s.close()


@pytest.mark.parametrize("n", [0, 1, 5])
def test_decoupled_step_over_the_grpc_stream(stream, n):
    """Rule (Triton's ensemble scheduler): each response of a decoupled step (repeat)
    runs the steps after it (py_echo_int) once; the ensemble answers once per set of
    its outputs, in order, OUT and IDX of one repeat response together; the final
    flag comes once every step request is complete: on the last response if it was
    the last thing running, else alone after it (0 responses: the flag alone)."""
    stream.send("ens_repeat", np.arange(10, 10 + n, dtype=np.int32), f"e{n}")
    got = stream.until_final()
    assert all(e is None for _, e in got)
    data = [r for r, _ in got if r.get_response().outputs]
    assert len(data) == n and len(got) in (n, n + 1)
    assert not any(_final(r) for r, _ in got[:-1])
    for i, r in enumerate(data):
        assert r.get_response().id == f"e{n}"
        assert r.get_response().model_name == "ens_repeat"
        assert r.as_numpy("OUT").tolist() == [10 + i]
        assert r.as_numpy("IDX").tolist() == [i]
    if len(got) > n:  # the flag alone, after the last response
        assert not got[-1][0].get_response().outputs


def test_decoupled_step_error_mid_stream_ends_the_request(stream):
    """Rule (Triton): an error response of a decoupled step fails the ensemble request:
    its error, naming the step, is the request's last answer (what came before it went
    out as it came); the stream stays open for the next request."""
    stream.send("ens_repeat", np.array([1, -1, 3], dtype=np.int32), "bad")
    got = stream.until_final()
    *before, (_, error) = got
    assert error is not None
    assert error.message() == ("in ensemble 'ens_repeat', step 0 (model 'repeat'): "
                               "element 1 is -1")
    # element 0's response may have been done before the error came; never element 2's
    assert [r.as_numpy("OUT").tolist() for r, _ in before] in ([], [[1]])
    stream.send("ens_repeat", np.array([4], dtype=np.int32), "after")
    got = stream.until_final()
    assert got[0][0].as_numpy("OUT").tolist() == [4] and len(got) in (1, 2)


def test_decoupled_step_with_large_tensors_passes_blocks_and_leaks_none(stream):
    """Rule: a decoupled step's outputs are blocks in its worker's arena that the next
    step reads in place; a block that is also an ensemble output (RAW) goes to the
    client once the step reading it is done; every block comes back (the fixture
    checks shared memory and the log at exit)."""
    x = np.arange(BIG, dtype=np.int32)
    for rid in ("big1", "big2"):
        stream.send("ens_fanout", x, rid, count=4)
        got = stream.until_final()
        assert all(e is None for _, e in got)
        data = [r for r, _ in got if r.get_response().outputs]
        assert len(data) == 4
        for k, r in enumerate(data):
            np.testing.assert_array_equal(r.as_numpy("RAW"), x + k)
            np.testing.assert_array_equal(r.as_numpy("OUT"), x + k)


def _post(server, path, body: bytes):
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=body,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=T) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize("n", [0, 3])
def test_decoupled_step_over_http_infer_stream(dec_server, n):
    """Rule: the HTTP streaming route answers an ensemble with a decoupled step with
    one frame per set of its outputs, in order (the final flag adds no frame)."""
    values = list(range(20, 20 + n))
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [n],
                                   "data": values}],
                       "parameters": {"binary_data_output": True}}).encode()
    status, _, out = _post(dec_server, "/v2/models/ens_repeat/infer_stream", body)
    assert status == 200
    frames = list(read_frames(out))
    assert len(frames) == n
    for i, (hlen, data) in enumerate(frames):
        r = httpclient.InferResult.from_response_body(data, header_length=hlen)
        assert r.as_numpy("OUT").tolist() == [20 + i]
        assert r.as_numpy("IDX").tolist() == [i]


def test_decoupled_step_over_generate_stream(dec_server):
    """Rule (extension_generate.md): generate_stream sends each ensemble response as
    an SSE event as it comes, the outputs by name; generate takes the one response."""
    status, headers, out = _post(dec_server, "/v2/models/ens_repeat/generate_stream",
                                 b'{"IN": [7, 8, 9]}')
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(c[len(b"data: "):]) for c in out.split(b"\n\n") if c]
    assert [(e["OUT"], e["IDX"]) for e in events] == [(7, 0), (8, 1), (9, 2)]
    assert all(e["model_name"] == "ens_repeat" for e in events)
    status, _, out = _post(dec_server, "/v2/models/ens_repeat/generate", b'{"IN": [5]}')
    # the sequence fields every ensemble response carries, as Triton 2.51's generate
    assert status == 200 and json.loads(out) == {
        "model_name": "ens_repeat", "model_version": "1", "OUT": 5, "IDX": 0,
        "sequence_id": 0, "sequence_start": False, "sequence_end": False}


def test_an_ensemble_with_a_decoupled_step_is_decoupled(dec_server):
    """Rule (Triton's ValidateEnsembleConfig): an ensemble with a decoupled step on its
    data flow is decoupled, its config says so though it did not ask; unary ModelInfer
    and HTTP /infer refuse it with Triton's texts, and the server keeps serving."""
    h = clients.HttpClient(dec_server.http_url)
    g = grpcclient.InferenceServerClient(dec_server.grpc_url)
    assert h.get_model_config("ens_repeat")["model_transaction_policy"] == {
        "decoupled": True}
    assert g.get_model_config("ens_repeat").config.model_transaction_policy.decoupled
    x = np.array([1, 2], dtype=np.int32)
    gi = grpcclient.InferInput("IN", [2], "INT32")
    gi.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        g.infer("ens_repeat", [gi])
    assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
    assert exc.value.message() == ("ModelInfer RPC doesn't support models with decoupled "
                                   "transaction policy")
    hi = httpclient.InferInput("IN", [2], "INT32")
    hi.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        h.infer("ens_repeat", [hi])
    assert exc.value.status() == "501"
    assert "doesn't support models with decoupled transaction policy" in \
        exc.value.message()
    assert h.is_model_ready("ens_repeat") and g.is_server_live()


def _mode(mode: str):
    inp = grpcclient.InferInput("MODE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    return inp


def _stream_report(server) -> str:
    """How cancel_stream's last stream ended, asked of the model itself."""
    s = Stream(server)
    try:
        s.client.async_stream_infer("cancel_stream", [_mode("report")])
        result, error = s.responses.get(timeout=T)
        assert error is None, error
        return result.as_numpy("LAST")[0].decode()
    finally:
        s.close()


def test_a_cancelled_stream_reaches_the_running_decoupled_step(dec_server):
    """Rule: cancelling an ensemble request (the client closes its stream with
    cancel_requests) cancels the step requests it started: the decoupled step that
    streams until cancelled sees response_sender.is_cancelled() and ends, and the
    server keeps serving (the fixture checks that every block came back)."""
    s = Stream(dec_server)
    s.client.async_stream_infer("ens_cancel_stream", [_mode("stream")])
    result, error = s.responses.get(timeout=T)
    assert error is None, error
    assert result.as_numpy("OUT").tolist() == [0]  # streaming through the echo step
    s.client.stop_stream(cancel_requests=True)
    s.client.close()
    wait_until(lambda: _stream_report(dec_server) != "running", T,
               what="the decoupled step to end its stream")
    assert _stream_report(dec_server) == "cancelled"
