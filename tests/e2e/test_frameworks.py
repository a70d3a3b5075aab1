"""onnxruntime and PyTorch models built at test time, served through the real server:
auto-completed configs, inference over HTTP and gRPC, batching, client shared memory,
and where the instances run."""

from __future__ import annotations

import concurrent.futures
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.e2e import clients
from tests.e2e.harness import ServerProcess

pytestmark = pytest.mark.e2e

try:
    from tests import torch_models
except ImportError:  # torch is optional: its tests skip without it
    torch_models = None

MLP_CONFIG = """
name: "onnx_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 512 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

GPU_CONFIG = """
name: "onnx_on_gpu"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
"""


def build_repository(root: Path) -> Path:
    onnx_models.add_sub(root / "onnx_add_sub")  # no config.pbtxt: all from the graph
    onnx_models.identity(root / "onnx_fixed", dynamic_batch=False, dims=(4,))
    onnx_models.identity(root / "onnx_identity", dims=(1024,))
    onnx_models.string_identity(root / "onnx_strings")
    onnx_models.mlp(root / "onnx_mlp", config=MLP_CONFIG)
    onnx_models.identity(root / "onnx_on_gpu", config=GPU_CONFIG)
    if torch_models is not None:
        torch_models.build_e2e_models(root)
    return root


@pytest.fixture(scope="module")
def fw_server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("framework-models"))
    srv = ServerProcess([repo], "--allow-client-shm=true", "--exit-on-error=false",
                        "--strict-readiness=false",
                        "--backend-config=onnxruntime,default-max-batch-size=8",
                        frontends=1, log_dir=tmp_path_factory.mktemp("fw-logs"),
                        env={"SHMSERVE_GPUS": "0"})
    srv.repo = repo
    yield from srv.serve()


def _config(client, protocol, model):
    if protocol == "http":
        return client.get_model_config(model)
    from google.protobuf import json_format
    return json_format.MessageToDict(client.get_model_config(model).config,
                                     preserving_proto_field_name=True)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_onnx_config_completed_from_the_graph(fw_server, protocol):
    client = clients.client(fw_server, protocol)
    config = _config(client, protocol, "onnx_add_sub")
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    # every dimension 0 is dynamic: batching, with --backend-config's default size
    assert int(config["max_batch_size"]) == 8
    assert "dynamic_batching" in config
    assert [int(x) for x in config["dynamic_batching"]["preferred_batch_size"]] == [8]
    inputs = {i["name"]: i for i in config["input"]}
    assert set(inputs) == {"INPUT0", "INPUT1"}
    assert inputs["INPUT0"]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in inputs["INPUT0"]["dims"]] == [16]
    assert sorted(o["name"] for o in config["output"]) == ["OUTPUT0", "OUTPUT1"]
    # Triton's onnxruntime backend runs two CPU instances by default
    groups = config["instance_group"]
    assert groups[0]["kind"] == "KIND_CPU" and int(groups[0]["count"]) == 2

    fixed = _config(client, protocol, "onnx_fixed")
    assert int(fixed.get("max_batch_size", 0)) == 0
    assert [int(d) for d in fixed["input"][0]["dims"]] == [4]
    assert "dynamic_batching" not in fixed


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_onnx_infer(fw_server, protocol):
    client = clients.client(fw_server, protocol)
    a = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    b = np.ones((3, 16), dtype=np.float32)
    result = client.infer("onnx_add_sub", [clients.infer_input(protocol, "INPUT0", a, "FP32"),
                                           clients.infer_input(protocol, "INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    # only what was asked for comes back
    result = client.infer("onnx_add_sub", [clients.infer_input(protocol, "INPUT0", a, "FP32"),
                                           clients.infer_input(protocol, "INPUT1", b, "FP32")],
                          outputs=[clients.requested(protocol, "OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)

    # onnxruntime's Python API carries strings as text: UTF-8 only
    words = np.array([[b"alpha"], [b""], ["grüße".encode()]], dtype=object)
    result = client.infer("onnx_strings", [clients.infer_input(protocol, "INPUT0", words,
                                                               "BYTES")])
    assert result.as_numpy("OUTPUT0").tolist() == words.tolist()


def test_onnx_mlp_batches_concurrent_requests(fw_server):
    """Concurrent requests are batched into one onnxruntime run and split back: every
    request gets its own rows."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1 + i % 3, 512)).astype(np.float32) for i in range(24)]
    outs = _concurrent_rows(fw_server, "grpc", "onnx_mlp", "INPUT0", "OUTPUT0", xs, 12)
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, onnx_models.mlp_reference(x), rtol=1e-4, atol=1e-4)


def _concurrent_rows(server, protocol, model, in_name, out_name, xs, threads):
    """Each x sent as its own request, many at once; the outputs in the same order."""
    def one(x):
        client = clients.client(server, protocol)
        result = client.infer(model, [clients.infer_input(protocol, in_name, x, "FP32")])
        return result.as_numpy(out_name)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, xs))


def _identity_through_system_shm(server, protocol, model, in_name, out_name, x):
    """Input from a client region, output into the same region after it; returns what
    the region holds there."""
    client = clients.client(server, protocol)
    key = f"/sstest-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, 2 * x.nbytes)
    name = f"r{uuid.uuid4().hex[:8]}"
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory(name, key, 2 * x.nbytes)
        mod = clients.module(protocol)
        inp = mod.InferInput(in_name, list(x.shape), "FP32")
        inp.set_shared_memory(name, x.nbytes)
        out = mod.InferRequestedOutput(out_name)
        out.set_shared_memory(name, x.nbytes, offset=x.nbytes)
        client.infer(model, [inp], outputs=[out])
        got = shm.get_contents_as_numpy(handle, np.float32, [2 * x.shape[0], *x.shape[1:]])
        return got[x.shape[0]:].copy()
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_onnx_with_system_shm(fw_server, protocol):
    x = np.arange(2 * 1024, dtype=np.float32).reshape(2, 1024)
    got = _identity_through_system_shm(fw_server, protocol, "onnx_identity", "INPUT0",
                                       "OUTPUT0", x)
    np.testing.assert_array_equal(got, x)


def test_framework_instances_share_one_cpu_worker(fw_server):
    """Framework instances (two per ORT model here, several models) run as threads of
    one CPU worker process, not a process each."""
    workers = []
    for pid in fw_server.children():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"workers.main" in argv:
            workers.append(argv[argv.index(b"--name") + 1].decode())
    assert workers.count("cpu worker") == 1, workers


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_kind_gpu_without_gpu_fails_to_load(fw_server, protocol):
    client = clients.client(fw_server, protocol)
    assert not client.is_model_ready("onnx_on_gpu")
    with pytest.raises(InferenceServerException, match="no GPUs are available"):
        client.infer("onnx_on_gpu", [clients.infer_input(
            protocol, "INPUT0", np.zeros((1, 16), np.float32), "FP32")])
    assert client.is_model_ready("onnx_add_sub")


needs_torch = pytest.mark.skipif(torch_models is None, reason="torch is not installed")


@needs_torch
@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
@pytest.mark.parametrize("model, names", [
    ("torch_add_sub", ("INPUT__0", "INPUT__1", "OUTPUT__0", "OUTPUT__1")),
    ("torch_add_sub_by_name", ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")),
])
def test_torch_naming_conventions(fw_server, protocol, model, names):
    """NAME__INDEX and forward()-argument names both reach the right arguments."""
    client = clients.client(fw_server, protocol)
    in0, in1, out0, out1 = names
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 3.0, dtype=np.float32)
    result = client.infer(model, [clients.infer_input(protocol, in0, a, "FP32"),
                                  clients.infer_input(protocol, in1, b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy(out0), a + b)
    np.testing.assert_array_equal(result.as_numpy(out1), a - b)


@needs_torch
@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_torch_dict_input_and_strings(fw_server, protocol):
    client = clients.client(fw_server, protocol)
    a = np.array([[1, 2, 3, 4]], dtype=np.float32)
    b = np.array([[0.5, 0.5, 0.5, 0.5]], dtype=np.float32)
    result = client.infer("torch_dict_input", [
        clients.infer_input(protocol, "INPUT_A", a, "FP32"),
        clients.infer_input(protocol, "INPUT_B", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    words = np.array([b"torch", b"script"], dtype=object)
    result = client.infer("torch_strings", [clients.infer_input(protocol, "TEXT__0", words,
                                                                "BYTES")])
    assert result.as_numpy("UPPER__0").tolist() == [b"TORCH", b"SCRIPT"]


@needs_torch
def test_torch_mlp_batches_concurrent_requests(fw_server):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1 + i % 2, 512)).astype(np.float32) for i in range(16)]
    model_dir = Path(fw_server.repo) / "torch_mlp"
    outs = _concurrent_rows(fw_server, "http", "torch_mlp", "INPUT__0", "OUTPUT__0", xs, 8)
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, torch_models.mlp_reference(model_dir, x), rtol=1e-4,
                                   atol=1e-4)


@needs_torch
def test_torch_with_system_shm(fw_server):
    x = np.linspace(-1, 1, 3 * 4096, dtype=np.float32).reshape(3, 4096)
    got = _identity_through_system_shm(fw_server, "grpc", "torch_identity", "INPUT__0",
                                       "OUTPUT__0", x)
    np.testing.assert_array_equal(got, x)


def test_a_killed_device_worker_comes_back_with_all_its_instances(fw_server):
    """The CPU worker hosts instances of several models; killed, it is started again
    and every one of those models serves again. (Last in this file: it kills.)"""
    import os
    import signal

    from tests.e2e.harness import wait_until

    def cpu_worker():
        for pid in fw_server.children():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"workers.main" in argv and argv[argv.index(b"--name") + 1] == b"cpu worker":
                return pid
        return None

    old = cpu_worker()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    new = wait_until(lambda: (pid := cpu_worker()) not in (None, old) and pid, 30,
                     what="a new cpu worker")
    client = clients.client(fw_server, "http")
    a = np.ones((1, 16), dtype=np.float32)

    def serves() -> bool:
        try:
            result = client.infer("onnx_add_sub", [
                clients.infer_input("http", "INPUT0", a, "FP32"),
                clients.infer_input("http", "INPUT1", a, "FP32")])
        except Exception:
            return False
        return bool((result.as_numpy("OUTPUT0") == 2).all())

    wait_until(serves, 120, 0.2, "onnx_add_sub serving again")
    x = np.zeros((1, 512), dtype=np.float32)
    outs = _concurrent_rows(fw_server, "http", "onnx_mlp", "INPUT0", "OUTPUT0", [x], 1)
    np.testing.assert_allclose(outs[0], onnx_models.mlp_reference(x), rtol=1e-4, atol=1e-4)
    assert cpu_worker() == new
