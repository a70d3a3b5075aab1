"""Ensembles end to end, over HTTP and gRPC: steps of python and ONNX models, a parallel
branch, intermediate tensors passed by reference (the workers' copy counters prove
none is copied), a failing step, an unknown step model, metadata, config, statistics
and client shared memory for ensemble outputs."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests import onnx_models

try:
    from tests import torch_models
except ImportError:  # no torch here: the three-framework ensemble is skipped
    torch_models = None
from tests.e2e import clients
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODELS_ENSEMBLE = ROOT / "tests" / "models_ensemble"
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
    onnx_models.identity(root / "onnx_identity", dims=("n",), config=ONNX_IDENTITY)
    if torch_models is not None:
        torch_models.identity(root / "torch_identity")
        (root / "ens_three" / "1").mkdir(parents=True)
        (root / "ens_three" / "config.pbtxt").write_text(ENS_THREE)
    return root


def start(tmp_path_factory, name: str, *args: str) -> ServerProcess:
    repo = build_repository(tmp_path_factory.mktemp(f"{name}-models"))
    markers = tmp_path_factory.mktemp(f"{name}-markers")  # py_meet_* meet there
    return ServerProcess([repo], "--exit-on-error=false", *args, frontends=2,
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


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_independent_steps_run_at_the_same_time(ens_server, protocol):
    """Rule: steps that do not depend on each other run at once: each of the two steps
    answers only while the other runs the same request (they wait for each other's
    marker), so a scheduler running them one after the other fails this."""
    token = 1 if protocol == "http" else 2
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


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_a_failing_step_fails_the_request_and_names_it(ens_server, protocol):
    """Rule: a step's error fails the ensemble request with Triton's "in ensemble"
    prefix, the failing step's model and its message; the server keeps serving."""
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


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_statistics_count_the_ensemble_and_its_steps(ens_server, protocol):
    """Rule (as Triton 2.51 reports it): an ensemble request is one execution and one
    success of the ensemble, with its steps' compute times summed, and one of each of
    its step models; a failed one is a failure of the ensemble."""
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
