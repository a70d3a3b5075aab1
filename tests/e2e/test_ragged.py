"""Ragged batching end to end: requests of different lengths, sent over HTTP and gRPC
at once, form one batch (the batcher is held with Triton's
TRITONSERVER_DELAY_SCHEDULER hook until all of them are queued, so the batch forms
exactly, not by timing); ONNX and TorchScript models get the ragged input concatenated
with the batch inputs their configs ask for, python models get each request's own
tensor; every client gets exactly its own result and batch_stats shows the one batch."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.e2e.clients import client, infer_input
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

try:
    from tests import torch_models
except ImportError:  # torch is optional: its tests skip without it
    torch_models = None

MODELS_RAGGED = ROOT / "tests" / "models_ragged"
HOLD = 3  # no batch forms until 3 requests are queued (once per model)
# each request: (protocol, length); one batch mixes both protocols
REQUESTS = (("http", 3), ("grpc", 4), ("http", 5))
BAD_CONFIG = """
name: "ragged_bad"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                data_type: TYPE_INT32 source_input: "MISSING" } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ragged-models")
    onnx_models.ragged_sums(repo / "ragged_onnx")
    onnx_models.ragged_sums(repo / "ragged_bad", config=BAD_CONFIG)
    if torch_models is not None:
        torch_models.ragged_sums(repo / "ragged_torch")
    srv = ServerProcess([repo, MODELS_RAGGED], "--exit-on-error=false",
                        "--strict-readiness=false", frontends=2,
                        log_dir=tmp_path_factory.mktemp("ragged-logs"),
                        env={"TRITONSERVER_DELAY_SCHEDULER": str(HOLD)})
    yield from srv.serve()


def one_batch(server, model: str) -> list[tuple[np.ndarray, object]]:
    """REQUESTS sent at once; each request's input and result, in order."""
    def infer(i):
        protocol, length = REQUESTS[i]
        x = (np.arange(1, length + 1, dtype=np.float32) * (i + 1)).reshape(1, length)
        result = client(server, protocol).infer(
            model, [infer_input(protocol, "INPUT", x, "FP32")])
        return x, result
    with cf.ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(infer, range(len(REQUESTS)), timeout=120))


def assert_one_batch(server, model: str) -> None:
    """The statistics extension saw one execution of HOLD requests, on both protocols.
    Responses go to the clients straight from the worker, so the scheduler may count
    the batch a moment after they arrive: poll for it, then check everything."""
    def counted():
        stats = client(server, "http").get_inference_statistics(model)["model_stats"][0]
        return stats if int(stats["inference_count"]) >= HOLD else None
    http = wait_until(counted, 30, what=f"statistics of {model}")
    assert int(http["execution_count"]) == 1
    assert int(http["inference_count"]) == HOLD
    assert {int(b["batch_size"]): int(b["compute_infer"]["count"])
            for b in http["batch_stats"]} == {HOLD: 1}
    grpc = client(server, "grpc").get_inference_statistics(model).model_stats[0]
    assert grpc.execution_count == 1
    assert [(b.batch_size, b.compute_infer.count) for b in grpc.batch_stats] == [(HOLD, 1)]


def test_onnx_ragged_batch_gives_every_client_its_own_results(ragged_server):
    """ONNX: INPUT concatenated, INDEX (BATCH_ACCUMULATED_ELEMENT_COUNT) and COUNT
    (BATCH_ELEMENT_COUNT) generated; per-request SUM and COUNT_OUT, and DOUBLED
    scattered back with BATCH_SCATTER_WITH_INPUT_SHAPE in each request's shape."""
    for x, result in one_batch(ragged_server, "ragged_onnx"):
        np.testing.assert_array_equal(result.as_numpy("SUM"), [[x.sum()]])
        np.testing.assert_array_equal(result.as_numpy("COUNT_OUT"), [[x.size]])
        doubled = result.as_numpy("DOUBLED")
        assert doubled.shape == x.shape
        np.testing.assert_array_equal(doubled, 2 * x)
    assert_one_batch(ragged_server, "ragged_onnx")


@pytest.mark.skipif(torch_models is None, reason="torch is not installed")
def test_torch_ragged_batch_gives_every_client_its_own_results(ragged_server):
    """TorchScript: OFFSETS (BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO) and SHAPES
    (BATCH_ITEM_SHAPE) reach forward(); SUM, NEG (scattered) and SHAPE_OUT come back
    to the request they belong to."""
    for x, result in one_batch(ragged_server, "ragged_torch"):
        np.testing.assert_array_equal(result.as_numpy("SUM"), [[x.sum()]])
        np.testing.assert_array_equal(result.as_numpy("NEG"), -x)
        np.testing.assert_array_equal(result.as_numpy("SHAPE_OUT"), [[x.shape[1]]])
    assert_one_batch(ragged_server, "ragged_torch")


def test_python_model_sees_each_requests_own_tensor(ragged_server):
    """Python backend: the ragged requests run in one execute() call (BATCH == 3) and
    each one's tensor is its own, shape and values."""
    for x, result in one_batch(ragged_server, "ragged_python"):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), x)
        np.testing.assert_array_equal(result.as_numpy("BATCH"), [[HOLD]])
    assert_one_batch(ragged_server, "ragged_python")


@pytest.mark.parametrize("protocol", ("http", "grpc"))
def test_config_endpoint_shows_batch_io(ragged_server, protocol):
    """batch_input, batch_output and allow_ragged_batch survive into the config
    endpoint, in Triton's spelling."""
    c = client(ragged_server, protocol)
    if protocol == "http":
        config = c.get_model_config("ragged_onnx")
    else:
        from google.protobuf import json_format
        config = json_format.MessageToDict(c.get_model_config("ragged_onnx").config,
                                           preserving_proto_field_name=True)
    assert config["input"][0]["allow_ragged_batch"] is True
    # protobuf's JSON leaves out enum 0 (BATCH_ELEMENT_COUNT); Triton's HTTP prints it
    assert [(b.get("kind", "BATCH_ELEMENT_COUNT"), b["target_name"], b["data_type"],
             b["source_input"])
            for b in config["batch_input"]] == [
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", ["INDEX"], "TYPE_INT32", ["INPUT"]),
        ("BATCH_ELEMENT_COUNT", ["COUNT"], "TYPE_INT32", ["INPUT"])]
    assert [(b.get("kind", "BATCH_SCATTER_WITH_INPUT_SHAPE"), b["target_name"],
             b["source_input"]) for b in config["batch_output"]] == [
        ("BATCH_SCATTER_WITH_INPUT_SHAPE", ["DOUBLED"], ["INPUT"])]
    # the inputs a client sees are the config's: batch inputs are the server's
    if protocol == "http":
        names = [i["name"] for i in c.get_model_metadata("ragged_onnx")["inputs"]]
    else:
        names = [i.name for i in c.get_model_metadata("ragged_onnx").inputs]
    assert names == ["INPUT"]


@pytest.mark.parametrize("protocol", ("http", "grpc"))
def test_bad_batch_input_is_a_load_error(ragged_server, protocol):
    """A batch input naming an input the model does not have fails to load with
    Triton's reason, which a request to it reports; the server stays up."""
    c = client(ragged_server, protocol)
    assert not c.is_model_ready("ragged_bad")
    x = np.ones((1, 2), np.float32)
    with pytest.raises(InferenceServerException) as exc:
        c.infer("ragged_bad", [infer_input(protocol, "INPUT", x, "FP32")])
    assert "unknown source input name 'MISSING'" in exc.value.message()
    assert c.is_server_live() and c.is_model_ready("ragged_onnx")
