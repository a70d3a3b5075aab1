"""CUDA shared memory and GPU instances (tests marked `gpu`; they skip without a CUDA
device and cupy). Each model reads its input from the client's CUDA region and writes
its output into another one; the server's own copy counters must show that nothing
crossed to the host on the way."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shm import cuda
from tests import onnx_models
from tests.e2e import clients
from tests.e2e.harness import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

if cuda.device_count() == 0:
    pytest.skip("no CUDA device", allow_module_level=True)
cp = pytest.importorskip("cupy")
cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")

N = 1 << 20  # FP32 elements per request: 4 MiB

ORT_CONFIG = """
name: "ort_cuda"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
""" % (N, N)

PY_CONFIG = """
name: "py_cupy"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }
"""

PY_MODEL = '''
import json
import cupy as cp
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])
        self.kind = args["model_instance_kind"]

    def execute(self, requests):
        out = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            x = cp.from_dlpack(tensor)
            where = json.dumps({"is_cpu": tensor.is_cpu(), "kind": self.kind,
                                "device": self.device})
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", x * 2),
                pb_utils.Tensor("WHERE", np.array([where.encode()], dtype=object))]))
        return out
'''


def _ort_has_cuda() -> bool:
    """onnxruntime-gpu is installed (the gpu extra; 255 MB, not always carried to the
    device): without it the module runs its cupy and torch models alone."""
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _build(root: Path) -> Path:
    if _ort_has_cuda():
        onnx_models.identity(root / "ort_cuda", dims=(N,), config=ORT_CONFIG)
    (root / "py_cupy" / "1").mkdir(parents=True)
    (root / "py_cupy" / "config.pbtxt").write_text(PY_CONFIG)
    (root / "py_cupy" / "1" / "model.py").write_text(textwrap.dedent(PY_MODEL))
    try:
        from tests import torch_models
        import torch
        if torch.cuda.is_available():
            torch_models.identity(root / "torch_cuda", dims=(N,), max_batch_size=8)
            cfg = root / "torch_cuda" / "config.pbtxt"
            # in place of the KIND_CPU group the helper writes: two groups would
            # give the model a CPU instance too, and its requests would cross the host
            text = cfg.read_text().replace("kind: KIND_CPU", "kind: KIND_GPU gpus: [ 0 ]")
            assert "KIND_GPU" in text and "KIND_CPU" not in text
            cfg.write_text(text)
    except ImportError:
        pass
    return root


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    repo = _build(tmp_path_factory.mktemp("gpu-models"))
    srv = ServerProcess([repo], "--allow-client-shm=true",
                        log_dir=tmp_path_factory.mktemp("gpu-logs"))
    srv.repo = repo
    srv.start()
    yield srv
    srv.stop()


def _copies(srv, model: str) -> dict[str, int]:
    """The bytes a model's workers copied, from the summary the server logs at exit."""
    m = re.search(rf"model '{model}' version 1: .*bytes copied host=(\d+) h2d=(\d+) "
                  rf"d2h=(\d+) d2d=(\d+)", srv.log())
    assert m, f"no summary for {model} in the log"
    return dict(zip(("host", "h2d", "d2h", "d2d"), map(int, m.groups())))


def _round_trip(srv, protocol: str, model: str, in_name: str, out_name: str, factor: float):
    client = clients.client(srv, protocol)
    x = cp.arange(N, dtype=cp.float32).reshape(1, N).get()
    nbytes = x.nbytes
    h_in = cudashm.create_shared_memory_region(f"{model}_in", nbytes, 0)
    h_out = cudashm.create_shared_memory_region(f"{model}_out", nbytes, 0)
    try:
        cudashm.set_shared_memory_region(h_in, [x])
        client.register_cuda_shared_memory(f"{model}_in", cudashm.get_raw_handle(h_in), 0,
                                           nbytes)
        client.register_cuda_shared_memory(f"{model}_out", cudashm.get_raw_handle(h_out), 0,
                                           nbytes)
        mod = clients.module(protocol)
        shape = [1, N] if model != "py_cupy" else [N]
        inp = mod.InferInput(in_name, shape, "FP32")
        inp.set_shared_memory(f"{model}_in", nbytes)
        out = mod.InferRequestedOutput(out_name)
        out.set_shared_memory(f"{model}_out", nbytes)
        outputs = [out]
        if model == "py_cupy":
            outputs.append(clients.requested(protocol, "WHERE"))
        result = client.infer(model, [inp], outputs=outputs)
        got = cudashm.get_contents_as_numpy(h_out, np.float32, shape)
        np.testing.assert_array_equal(got.reshape(-1), x.reshape(-1) * factor)
        return result
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(h_in)
        cudashm.destroy_shared_memory_region(h_out)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_cuda_shm_status(gpu_server, protocol):
    client = clients.client(gpu_server, protocol)
    h = cudashm.create_shared_memory_region("status_probe", 1024, 0)
    try:
        client.register_cuda_shared_memory("status_probe", cudashm.get_raw_handle(h), 0, 1024)
        status = client.get_cuda_shared_memory_status()
        text = str(status)
        assert "status_probe" in text and "1024" in text
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(h)


def test_ort_cuda_python_cupy_and_torch_stay_on_the_device(tmp_path_factory):
    """All three device models, CUDA-shm in and out; then, from the server's own
    counters: no device-to-host copy and no host copy happened for any of them."""
    repo = _build(tmp_path_factory.mktemp("gpu-models-copies"))
    srv = ServerProcess([repo], "--allow-client-shm=true",
                        log_dir=tmp_path_factory.mktemp("gpu-copies-logs"))
    srv.start()
    try:
        for protocol in clients.PROTOCOLS:
            if (repo / "ort_cuda").exists():
                _round_trip(srv, protocol, "ort_cuda", "INPUT0", "OUTPUT0", 1.0)
            result = _round_trip(srv, protocol, "py_cupy", "INPUT0", "OUTPUT0", 2.0)
            where = result.as_numpy("WHERE")[0].decode()
            assert '"is_cpu": false' in where and '"kind": "GPU"' in where
            if (repo / "torch_cuda").exists():
                _round_trip(srv, protocol, "torch_cuda", "INPUT__0", "OUTPUT__0", 1.0)
    finally:
        assert srv.stop() == 0
    models = [m for m in ("ort_cuda", "py_cupy", "torch_cuda") if (repo / m).exists()]
    for model in models:
        copies = _copies(srv, model)
        assert copies["d2h"] == 0 and copies["host"] == 0, (model, copies)
        assert copies["d2d"] > 0, (model, copies)
