"""A framework instance on a GPU, given a batch of small requests (workers/framework.py):
their inputs cross to the device in one copy per input and their outputs come back in
one copy per output, not one per request, and every request still gets its own rows.
TorchScript models, tensors inline or as device arrays; skipped without a GPU."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from scheduler.repository.config import config_to_json, load_config, normalize, validate  # noqa: E402
from shm.messages.frontend import InferRequest  # noqa: E402
from shm.messages.worker import LoadInstance  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from tests import torch_models as tm  # noqa: E402
from workers.backends import create_instance  # noqa: E402
from workers.framework import SMALL_TRANSFER  # noqa: E402
from workers.sequence import LocalTensor  # noqa: E402
from workers.tensors import TensorIO  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore:`torch.jit.*is deprecated:DeprecationWarning")]


def _cupy():
    from shm import cuda
    if cuda.device_count() < 1 or not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return cuda.cupy()


@pytest.fixture(scope="module")
def add_sub(tmp_path_factory):
    _cupy()
    model_dir = tm.add_sub(tmp_path_factory.mktemp("m") / "add_sub_gpu", dims=16,
                           max_batch_size=1 << 14)
    config = normalize(load_config(model_dir), model_files=["model.pt"])
    validate(config)
    msg = LoadInstance("i0", "add_sub_gpu_0", model_dir.name, 1, str(model_dir),
                       json.dumps(config_to_json(config)).encode(), kind="KIND_GPU",
                       device_id=0)
    inst, _ = create_instance(msg)
    yield inst
    inst.finalize()


def _request(i, a, b) -> InferRequest:
    def ref(name, x):
        if hasattr(x, "__cuda_array_interface__"):
            return LocalTensor(name, "FP32", list(x.shape), array=x)
        return TensorRef(name, "FP32", list(x.shape), data=x.tobytes())
    return InferRequest(i, "test", "add_sub_gpu", 1, [ref("INPUT__0", a), ref("INPUT__1", b)],
                        batch_size=a.shape[0])


def _check(results, pairs):
    assert not any(isinstance(r, Exception) for r in results), results
    for (a, b), out in zip(pairs, results):
        got = {name: array for name, _, array in out}
        assert all(isinstance(x, np.ndarray) for x in got.values()), "not brought to the host"
        host = [x.get() if hasattr(x, "__cuda_array_interface__") else x for x in (a, b)]
        np.testing.assert_allclose(got["OUTPUT__0"], host[0] + host[1], rtol=1e-6)
        np.testing.assert_allclose(got["OUTPUT__1"], host[0] - host[1], rtol=1e-6)


def test_small_requests_cross_once_per_tensor(add_sub):
    rng = np.random.default_rng(0)
    pairs = [tuple(rng.standard_normal((1 + i % 2, 16), dtype=np.float32) for _ in "ab")
             for i in range(8)]
    add_sub.copies = type(add_sub.copies)()
    results = add_sub.execute([_request(i, a, b) for i, (a, b) in enumerate(pairs)],
                              TensorIO(None, "test"))
    _check(results, pairs)
    copies = add_sub.copies
    assert (copies.h2d_ops, copies.d2h_ops, copies.d2d_ops) == (2, 2, 0), copies.as_list()
    rows = sum(a.shape[0] for a, _ in pairs)
    assert copies.h2d == copies.d2h == 2 * rows * 16 * 4


def test_device_and_large_inputs_split_the_host_runs(add_sub):
    """Host runs around a device input are each one copy; an input of a size where the
    bytes cost more than the call goes over by itself, not through a host join."""
    cp = _cupy()
    rng = np.random.default_rng(1)
    big = SMALL_TRANSFER // (16 * 4) + 1  # rows that make one input over the threshold

    def pair(rows, device=False):
        a, b = (rng.standard_normal((rows, 16), dtype=np.float32) for _ in "ab")
        return (cp.asarray(a), cp.asarray(b)) if device else (a, b)

    pairs = [pair(1), pair(1), pair(1, device=True), pair(1), pair(big), pair(1)]
    add_sub.copies = type(add_sub.copies)()
    results = add_sub.execute([_request(i, a, b) for i, (a, b) in enumerate(pairs)],
                              TensorIO(None, "test"))
    _check(results, pairs)
    copies = add_sub.copies
    # per input: [0, 1] joined, [2] on the device, [3] alone (next to a big one), [4], [5]
    assert copies.h2d_ops == 2 * 4 and copies.d2d_ops == 2, copies.as_list()
    # the outputs are small on average over the batch: each comes back whole, once
    assert copies.d2h_ops == 2


def test_large_outputs_come_back_per_request(add_sub):
    """Rows that are large on average are copied per request, straight into where
    each goes (the worker's pinned arena, a client's region), not joined on the host."""
    rng = np.random.default_rng(2)
    rows = 2 * SMALL_TRANSFER // (16 * 4)
    pairs = [tuple(rng.standard_normal((rows, 16), dtype=np.float32) for _ in "ab")
             for _ in range(2)]
    add_sub.copies = type(add_sub.copies)()
    results = add_sub.execute([_request(i, a, b) for i, (a, b) in enumerate(pairs)],
                              TensorIO(None, "test"))
    assert add_sub.copies.d2h_ops == 0 and add_sub.copies.h2d_ops == 4
    for (a, b), out in zip(pairs, results):
        got = {name: array for name, _, array in out}
        assert all(hasattr(x, "__cuda_array_interface__") for x in got.values())
        np.testing.assert_allclose(got["OUTPUT__0"].get(), a + b, rtol=1e-6)


BYTES_CONFIG = """name: "bytes_gpu"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_bytes_inputs_stay_on_the_host(tmp_path):
    """A GPU onnxruntime instance given BYTES requests, one and several to a batch:
    strings cannot live on a device, so they reach the model as host arrays (it runs
    such a batch through session.run) and every request gets its own strings back."""
    _cupy()
    pytest.importorskip("onnx")
    from tests import onnx_models
    model_dir = onnx_models.string_identity(tmp_path / "bytes_gpu", config=BYTES_CONFIG)
    config = normalize(load_config(model_dir), model_files=["model.onnx"])
    validate(config)
    msg = LoadInstance("i1", "bytes_gpu_0", model_dir.name, 1, str(model_dir),
                       json.dumps(config_to_json(config)).encode(), kind="KIND_GPU",
                       device_id=0)
    try:
        inst, _ = create_instance(msg)
    except Exception as exc:  # an onnxruntime without the CUDA provider
        pytest.skip(f"no GPU onnxruntime: {exc}")
    from shm import datatypes
    try:
        for words in ([[b"a"]], [[b"bc"], [b"d"], [b""]]):
            requests = []
            for i, word in enumerate(words):
                array = np.array([word], dtype=object)
                buf = datatypes.tensor_to_buffer("BYTES", array)
                requests.append(InferRequest(i, "test", "bytes_gpu", 1, [TensorRef(
                    "INPUT0", "BYTES", [1, 1], data=bytes(buf))], batch_size=1))
            results = inst.execute(requests, TensorIO(None, "test"))
            assert not any(isinstance(r, Exception) for r in results), results
            for word, out in zip(words, results):
                (name, datatype, array), = out
                assert datatype == "BYTES" and array.tolist() == [word]
    finally:
        inst.finalize()
