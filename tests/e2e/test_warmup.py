"""Model warmup end to end: the model_warmup samples run on every (non-passive) instance
before the model is READY, with the data the config names; a failing warmup leaves the
model UNAVAILABLE with the warmup's reason while the server serves the others; warmup
never counts in statistics. Python models record what they ran (tests/models_warmup);
ONNX models are built here."""

import json

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import ROOT, ServerProcess
from tests.e2e.test_statistics import stats

pytestmark = pytest.mark.e2e

MODELS_WARMUP = ROOT / "tests" / "models_warmup"

ONNX_WARMUP = """
name: "onnx_warmup"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [ {
  name: "rows" batch_size: 4 count: 2
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
} ]
"""

# The graph takes [batch, 4]; this warmup sends [1, 5], which onnxruntime refuses: only
# a warmup that really runs through the framework can fail this way.
ONNX_BAD_WARMUP = """
name: "onnx_bad_warmup"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [ {
  name: "wrong shape" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } }
} ]
"""


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory):
    onnx_repo = tmp_path_factory.mktemp("onnx-warmup")
    onnx_models.identity(onnx_repo / "onnx_warmup", dims=(4,), config=ONNX_WARMUP)
    onnx_models.identity(onnx_repo / "onnx_bad_warmup", dims=(4,), config=ONNX_BAD_WARMUP)
    probe_dir = tmp_path_factory.mktemp("warmup-probe")
    srv = ServerProcess([MODELS_WARMUP, onnx_repo], "--exit-on-error=false",
                        "--strict-readiness=false",
                        log_dir=tmp_path_factory.mktemp("warmup-logs"),
                        env={"WARMUP_PROBE_DIR": str(probe_dir), "SHMSERVE_GPUS": "0"})
    srv.probe_dir = probe_dir
    srv.start()
    # what the probe recorded while loading, read before any test sends a request
    srv.records_at_ready = _records(probe_dir)
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()
    assert srv.segments() == [], "server left shared memory behind"


def _records(folder) -> dict[str, list[dict]]:
    """instance name -> the probe's recorded events, in order."""
    return {p.stem: [json.loads(line) for line in p.read_text().splitlines() if line]
            for p in sorted(folder.glob("*.jsonl"))}


def _probe_inputs(batch=1, value=1.0):
    return {"INPUT0": (np.full((batch, 4), value, np.float32), "FP32"),
            "INPUT1": (np.ones((batch, 3), np.int32), "INT32"),
            "TEXT": (np.array([[b"a", b"b"]] * batch, dtype=object), "BYTES")}


def _infer(srv, protocol, model, inputs):
    c = client(srv, protocol)
    return c.infer(model, [infer_input(protocol, n, a, t) for n, (a, t) in inputs.items()])


def test_every_active_instance_ran_each_sample_count_times_before_ready(warm_server):
    """Rule: warmup runs on every instance before the model is READY: each sample
    `count` times (at least once), in order, as one batch of `batch_size` requests of
    shape [1, *dims]; batch_size 0 samples are skipped; passive instances are not
    warmed up."""
    recs = warm_server.records_at_ready
    active = sorted(n for n in recs if n.startswith("warmup_probe_0_"))
    assert active == ["warmup_probe_0_0", "warmup_probe_0_1"], recs.keys()
    for name in active:
        events = recs[name]
        assert events[0] == {"event": "initialize"}
        calls = [e["requests"] for e in events[1:]]
        # "zeros": 3 runs of a batch of 2; "skipped" (batch 0): none; "random": 1 run of 1
        assert [len(c) for c in calls] == [2, 2, 2, 1], name
        for request in [r for c in calls for r in c]:
            assert request["INPUT0"]["shape"] == [1, 4]
            assert request["INPUT1"]["shape"] == [1, 3]
            assert request["TEXT"]["shape"] == [1, 2]
    (standby,) = [n for n in recs if n.startswith("standby_")]
    assert recs[standby] == [{"event": "initialize"}]  # loaded, never warmed up


def test_warmup_data_is_what_the_sample_names(warm_server):
    """Rule: zero_data is zeros, input_data_file is the file's bytes exactly, STRING
    inputs get empty strings for zero and random data; random data has the shape."""
    calls = [e["requests"] for e in warm_server.records_at_ready["warmup_probe_0_0"][1:]]
    for request in [r for c in calls[:3] for r in c]:  # sample "zeros"
        assert request["INPUT0"]["values"] == [[0.0, 0.0, 0.0, 0.0]]
        assert request["INPUT1"]["values"] == [[7, -8, 9]]  # warmup/input1.bin
        assert request["TEXT"]["values"] == ["", ""]
    (random_request,) = calls[3]  # sample "random"
    assert len(random_request["INPUT0"]["values"][0]) == 4
    assert random_request["INPUT1"]["values"] == [[0, 0, 0]]
    assert random_request["TEXT"]["values"] == ["", ""]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_do_not_count_warmup(warm_server, protocol):
    """Rule: warmup requests do not count in statistics: a warmed model reads zero
    inferences and executions before its first request."""
    for model in ("warmup_probe", "onnx_warmup"):
        (entry,) = stats(warm_server, protocol, model).values()
        assert entry["inference_count"] == 0 and entry["execution_count"] == 0, model
        assert entry["last_inference"] == 0
        for key in ("success", "fail", "queue", "compute_input", "compute_infer",
                    "compute_output"):
            assert entry[key] == (0, 0), (model, key)
        assert entry["batch_stats"] == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model, reason", [
    ("warmup_fails", "failed to run warmup sample 'zero sample': "
                     "Failed to process the request(s) for model 'warmup_fails_0', "
                     "message: ValueError: all-zero input rejected\n\nAt:\n"),
    ("warmup_short_file", "warmup sample 'from file': warmup setting expects 16 bytes, "
                          "but the data provided from input0.bin only has 8 bytes"),
    ("onnx_bad_warmup", "failed to run warmup sample 'wrong shape': "),
])
def test_failed_warmup_leaves_the_model_unavailable_with_its_reason(warm_server, protocol,
                                                                    model, reason):
    """Rule: a failing warmup fails the load with its reason: the model is not ready,
    requests to it are refused with Triton 2.51's status and words for a model that
    failed to load (tests/data/triton_errors_2.51.json: model_not_ready) and that
    reason, and the server serves the others."""
    c = client(warm_server, protocol)
    assert c.is_server_live()
    assert not c.is_model_ready(model)
    with pytest.raises(InferenceServerException) as info:
        _infer(warm_server, protocol, model,
               {"INPUT0": (np.ones((1, 4) if model.startswith("onnx") else (4,),
                                   np.float32), "FP32")})
    assert info.value.status() == ("404" if protocol == "http" else "StatusCode.NOT_FOUND")
    assert info.value.message().startswith(f"Request for unknown model: '{model}' has no "
                                           "available versions: ")
    assert reason in info.value.message()
    assert c.is_model_ready("warmup_probe")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_warmed_models_serve_requests(warm_server, protocol):
    """Rule: a model whose warmup succeeded is READY and serves requests (python and
    ONNX), and the instance's real requests come after its warmup calls."""
    c = client(warm_server, protocol)
    assert c.is_model_ready("warmup_probe") and c.is_model_ready("onnx_warmup")
    out = _infer(warm_server, protocol, "warmup_probe", _probe_inputs(value=2.5))
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), np.full((1, 4), 2.5, np.float32))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = _infer(warm_server, protocol, "onnx_warmup", {"INPUT0": (x, "FP32")})
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x)
    served = [r for events in _records(warm_server.probe_dir).values()
              for e in events[1:] for r in e["requests"]
              if r["INPUT0"]["values"] == [[2.5] * 4]]
    assert served  # recorded after the warmup calls, which were all there at READY


ONNX_GPU_WARMUP = """
name: "onnx_gpu_warmup"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
model_warmup [ {
  name: "on device" batch_size: 2 count: 2
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
} ]
"""


GPU_WARMUP = """instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
model_warmup [ {
  name: "on device" batch_size: 2 count: 2
  inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
} ]
"""


def _gpu_warmup_model(repo) -> tuple[str, str, str]:
    """(model, input, output): the ONNX identity where onnxruntime has its CUDA
    provider, else a TorchScript one (the GPU machine's image has onnxruntime for the
    CPU alone, and onnxruntime-gpu is more than one device call carries)."""
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        onnx_models.identity(repo / "onnx_gpu_warmup", dims=(4,), config=ONNX_GPU_WARMUP)
        return "onnx_gpu_warmup", "INPUT0", "OUTPUT0"
    from tests import torch_models
    model = torch_models.identity(repo / "torch_gpu_warmup", dims=(4,))
    config = model / "config.pbtxt"
    text = config.read_text().replace("instance_group [ { count: 1 kind: KIND_CPU } ]\n",
                                      GPU_WARMUP)
    assert "KIND_GPU" in text and "KIND_CPU" not in text
    config.write_text(text)
    return "torch_gpu_warmup", "INPUT__0", "OUTPUT__0"


@pytest.mark.gpu
def test_gpu_instance_warms_up_on_its_device(tmp_path):
    """Rule: a KIND_GPU instance runs its warmup on its own device and stream before
    READY, and counts nothing in statistics."""
    from shm import cuda
    if cuda.device_count() == 0:
        pytest.skip("no CUDA device")
    model, input_name, output_name = _gpu_warmup_model(tmp_path / "repo")
    srv = ServerProcess([tmp_path / "repo"], log_dir=tmp_path)
    try:
        srv.start()
        for protocol in PROTOCOLS:
            (entry,) = stats(srv, protocol, model).values()
            assert entry["execution_count"] == 0
        x = np.ones((1, 4), np.float32)
        out = _infer(srv, "grpc", model, {input_name: (x, "FP32")})
        np.testing.assert_array_equal(out.as_numpy(output_name), x)
    finally:
        code = srv.stop()
    assert code == 0, srv.log()
    assert srv.segments() == []
