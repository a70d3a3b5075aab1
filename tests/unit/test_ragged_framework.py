"""Ragged batching in the worker (workers/framework.py with workers/batch_io.py), on
the real ONNX and TorchScript ragged models of tests/onnx_models.py and
tests/torch_models.py: a batch of requests of different lengths reaches the model as
one concatenated 1-D input with the batch inputs the config asks for, and every request
gets exactly its own results. Requests carry their tensors inline, so no process or
shared memory is involved."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from scheduler.repository.config import config_to_json, load_config, normalize, validate  # noqa: E402
from shm.messages.frontend import InferRequest, RequestedOutput  # noqa: E402
from shm.messages.worker import LoadInstance  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from tests import onnx_models  # noqa: E402
from workers.backends import create_instance  # noqa: E402
from workers.tensors import TensorIO  # noqa: E402

try:
    from tests import torch_models
except ImportError:  # torch is optional
    torch_models = None


def instance(model_dir: Path, filename: str):
    config = normalize(load_config(model_dir), model_files=[filename])
    validate(config)
    import json
    msg = LoadInstance("i0", f"{model_dir.name}_0", model_dir.name, 1, str(model_dir),
                       json.dumps(config_to_json(config)).encode())
    inst, _ = create_instance(msg)
    return inst


def request(i: int, array: np.ndarray, outputs=None) -> InferRequest:
    ref = TensorRef("INPUT", "FP32", list(array.shape), data=array.tobytes())
    wanted = None if outputs is None else [RequestedOutput(n) for n in outputs]
    return InferRequest(i, "test", "m", 1, [ref], outputs=wanted, batch_size=array.shape[0])


def run(inst, requests):
    results = inst.execute(requests, TensorIO(None, "test"))  # inline tensors only
    assert not any(isinstance(r, Exception) for r in results), results
    return [{name: np.asarray(array) for name, _, array in out} for out in results]


LENGTHS = (3, 4, 5)


def inputs(lengths=LENGTHS):
    return [np.arange(1, n + 1, dtype=np.float32).reshape(1, n) * (i + 1)
            for i, n in enumerate(lengths)]


@pytest.fixture(scope="module")
def onnx_ragged(tmp_path_factory):
    inst = instance(onnx_models.ragged_sums(tmp_path_factory.mktemp("m") / "ragged_onnx"),
                    "model.onnx")
    yield inst
    inst.finalize()


def test_onnx_requests_of_different_lengths_each_get_their_own_results(onnx_ragged):
    """Ragged INPUT concatenated, INDEX = BATCH_ACCUMULATED_ELEMENT_COUNT and COUNT =
    BATCH_ELEMENT_COUNT generated: per-request SUM and COUNT_OUT come back to their
    request, DOUBLED is scattered back in each request's input shape."""
    xs = inputs()
    results = run(onnx_ragged, [request(i, x) for i, x in enumerate(xs)])
    for x, out in zip(xs, results):
        np.testing.assert_array_equal(out["SUM"], [[x.sum()]])
        np.testing.assert_array_equal(out["COUNT_OUT"], [[x.size]])
        assert out["COUNT_OUT"].dtype == np.int32
        np.testing.assert_array_equal(out["DOUBLED"], 2 * x)


def test_onnx_batch_of_one_is_flattened_too(onnx_ragged):
    """Triton's backends flatten a ragged input whatever the batch: one request alone
    gets the same answers."""
    x = inputs((6,))[0]
    (out,) = run(onnx_ragged, [request(0, x)])
    np.testing.assert_array_equal(out["SUM"], [[x.sum()]])
    np.testing.assert_array_equal(out["DOUBLED"], 2 * x)


def test_scatter_keeps_batch_dimensions_of_larger_requests(onnx_ragged):
    """A batch-2 request's scattered output has its own [2, n] shape, between requests
    of other shapes."""
    xs = [np.arange(3, dtype=np.float32).reshape(1, 3),
          np.arange(8, dtype=np.float32).reshape(2, 4) + 10,
          np.arange(2, dtype=np.float32).reshape(1, 2) + 100]
    results = run(onnx_ragged, [request(i, x, ["DOUBLED"]) for i, x in enumerate(xs)])
    for x, out in zip(xs, results):
        assert set(out) == {"DOUBLED"}
        assert out["DOUBLED"].shape == x.shape
        np.testing.assert_array_equal(out["DOUBLED"], 2 * x)


@pytest.mark.skipif(torch_models is None, reason="torch is not installed")
def test_torch_requests_of_different_lengths_each_get_their_own_results(tmp_path):
    """TorchScript: OFFSETS = BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO and SHAPES =
    BATCH_ITEM_SHAPE reach forward() by argument name; NEG is scattered back."""
    inst = instance(torch_models.ragged_sums(tmp_path / "ragged_torch"), "model.pt")
    try:
        xs = inputs((5, 1, 3))
        results = run(inst, [request(i, x) for i, x in enumerate(xs)])
        for x, out in zip(xs, results):
            np.testing.assert_array_equal(out["SUM"], [[x.sum()]])
            np.testing.assert_array_equal(out["NEG"], -x)
            np.testing.assert_array_equal(out["SHAPE_OUT"], [[x.shape[1]]])
    finally:
        inst.finalize()
