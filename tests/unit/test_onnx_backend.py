"""Tests for workers.onnx_backend: Triton's onnxruntime-backend auto-complete and checks,
session options, execution providers, and runs on tiny ONNX models the tests build
(tests/onnx_models.py). CPU here; the GPU tests need CUDA, cupy and onnxruntime-gpu."""

import copy
import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

pytest.importorskip("onnx")

from scheduler.repository.config import config_to_json, normalize, parse_config, validate  # noqa: E402
from shm.errors import ErrorCode, InferError  # noqa: E402
from tests import onnx_models as om  # noqa: E402
from workers import onnx_backend as ob  # noqa: E402
from workers.onnx_backend import OnnxModel, auto_complete  # noqa: E402

ALL_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
             "INT64", "FP16", "FP32", "FP64"]


def path_of(model_dir) -> str:
    return str(model_dir / "1" / "model.onnx")


def bare(name="m", **fields) -> dict:
    return {"name": name, "backend": "onnxruntime", **fields}


def io(name, data_type, dims, **fields) -> dict:
    return {"name": name, "data_type": data_type, "dims": list(dims), **fields}


def load(model_dir, config=None, device="cpu", backend_config=None, **kwargs) -> OnnxModel:
    """An instance on the auto-completed config (or `config` as given)."""
    if config is None:
        config = auto_complete(bare(model_dir.name), path_of(model_dir), {})
    return OnnxModel(config, path_of(model_dir), device, backend_config or {}, **kwargs)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx_repo")


@pytest.fixture(scope="module")
def add_sub(repo):
    return om.add_sub(repo / "add_sub")


@pytest.fixture(scope="module")
def mlp(repo):
    return om.mlp(repo / "mlp", sizes=(64, 128, 32), seed=1)


@pytest.fixture(scope="module")
def fixed(repo):
    return om.identity(repo / "fixed", "FP32", dynamic_batch=False, dims=(2, 16))


# --- auto-complete ---------------------------------------------------------------


def test_dynamic_batch_gets_default_max_batch_and_dynamic_batching(add_sub):
    out = auto_complete(bare("add_sub"), path_of(add_sub), {})
    assert out["max_batch_size"] == 4
    assert out["dynamic_batching"] == {}
    assert out["input"] == [io("INPUT0", "TYPE_FP32", [16]), io("INPUT1", "TYPE_FP32", [16])]
    assert out["output"] == [io("OUTPUT0", "TYPE_FP32", [16]), io("OUTPUT1", "TYPE_FP32", [16])]


def test_default_max_batch_size_from_backend_config(add_sub):
    out = auto_complete(bare(), path_of(add_sub), {"default-max-batch-size": "8"})
    assert out["max_batch_size"] == 8 and out["dynamic_batching"] == {}
    # 1 batches, but there is nothing to gather: no dynamic batcher is added
    out = auto_complete(bare(), path_of(add_sub), {"default-max-batch-size": "1"})
    assert out["max_batch_size"] == 1 and "dynamic_batching" not in out
    out = auto_complete(bare(), path_of(add_sub), {"default-max-batch-size": "0"})
    assert out["max_batch_size"] == 0 and out["input"][0]["dims"] == [-1, 16]


def test_fixed_first_dim_means_no_batching_and_full_dims(fixed):
    out = auto_complete(bare(max_batch_size=0), path_of(fixed), {})
    assert out["max_batch_size"] == 0
    assert "dynamic_batching" not in out
    assert out["input"] == [io("INPUT0", "TYPE_FP32", [2, 16])]
    assert out["output"] == [io("OUTPUT0", "TYPE_FP32", [2, 16])]


def test_explicit_max_batch_and_scheduler_are_kept(add_sub):
    seq = {"max_sequence_idle_microseconds": 5000000}
    out = auto_complete(bare(max_batch_size=16, sequence_batching=seq), path_of(add_sub), {})
    assert out["max_batch_size"] == 16 and out["sequence_batching"] == seq
    assert "dynamic_batching" not in out
    batching = {"max_queue_delay_microseconds": 100}
    out = auto_complete(bare(max_batch_size=16, dynamic_batching=batching), path_of(add_sub), {})
    assert out["dynamic_batching"] == batching
    out = auto_complete(bare(max_batch_size=16), path_of(add_sub), {})
    assert out["dynamic_batching"] == {}


def test_config_listing_inputs_and_outputs_is_only_checked(add_sub):
    # As in Triton: nothing is completed, not even max_batch_size, and nothing changes.
    # Inputs may fix what the model leaves variable (outputs must match exactly).
    config = bare(max_batch_size=0,
                  input=[io("INPUT1", "TYPE_FP32", [-1, 16]), io("INPUT0", "TYPE_FP32", [4, 16])],
                  output=[io("OUTPUT1", "TYPE_FP32", [-1, 16])])
    before = copy.deepcopy(config)
    assert auto_complete(config, path_of(add_sub), {}) == before
    assert config == before  # the argument is not modified


def test_config_listing_inputs_only_gets_outputs(add_sub):
    config = bare(max_batch_size=8, input=[io("INPUT0", "TYPE_FP32", [16]),
                                           io("INPUT1", "TYPE_FP32", [16])])
    out = auto_complete(config, path_of(add_sub), {})
    assert out["input"] == config["input"]
    assert [o["name"] for o in out["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert out["output"][0]["dims"] == [16] and out["dynamic_batching"] == {}


def test_scalar_per_batch_item_gets_dims_1_and_empty_reshape(repo):
    d = om.identity(repo / "scalar", "INT32", dims=())
    out = auto_complete(bare(), path_of(d), {})
    assert out["input"] == [io("INPUT0", "TYPE_INT32", [1], reshape={"shape": []})]
    model = OnnxModel(out, path_of(d), "cpu", {})
    x = np.arange(3, dtype=np.int32).reshape(3, 1)
    got = model.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert got.shape == (3, 1)
    np.testing.assert_array_equal(got, x)


def test_strings_and_model_directory_path(repo):
    d = om.string_identity(repo / "strings")
    out = auto_complete(bare(), str(d / "1"), {})  # a directory holding model.onnx
    assert out["input"] == [io("INPUT0", "TYPE_STRING", [1])]


def test_printed_config_round_trips_through_the_scheduler(add_sub):
    # What the scheduler sends (config_to_json of a normalized config) and parses back.
    printed = config_to_json(normalize(parse_config('name: "add_sub" backend: "onnxruntime"',
                                                    "add_sub/config.pbtxt")))
    out = auto_complete(json.loads(json.dumps(printed)), path_of(add_sub), {})
    parsed = normalize(json_format.ParseDict(out, ModelConfig(), ignore_unknown_fields=True))
    validate(parsed)
    assert parsed.max_batch_size == 4
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4]
    assert [i.name for i in parsed.input] == ["INPUT0", "INPUT1"]
    assert list(parsed.input[0].dims) == [16]


@pytest.mark.parametrize("config, reason", [
    (bare(input=[io("INPUT0", "TYPE_INT32", [16]), io("INPUT1", "TYPE_FP32", [16])]),
     "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"),
    (bare(input=[io("INPUT0", "TYPE_FP32", [16]), io("NOPE", "TYPE_FP32", [16])]),
     "configuration names input 'NOPE', which the model does not have"),
    (bare(input=[io("INPUT0", "TYPE_FP32", [16])]),
     "configuration expects 1 inputs, model provides 2"),
    (bare(max_batch_size=4, input=[io("INPUT0", "TYPE_FP32", [8]),
                                   io("INPUT1", "TYPE_FP32", [16])]),
     r"the model expects 2 dimensions \(shape \[-1,16\]\) but the model configuration "
     r"specifies 2 dimensions .*complete shape \[-1,8\]"),
    (bare(output=[io("OUTPUT0", "TYPE_FP32", [-1])]),
     r"tensor 'OUTPUT0': the model expects 2 dimensions"),  # outputs compare exactly
    (bare(max_batch_size=4, output=[io("OUTPUT0", "TYPE_FP16", [16])]),
     "configuration expects datatype TYPE_FP16 for output 'OUTPUT0'"),
])
def test_contradictions_are_rejected(add_sub, config, reason):
    with pytest.raises(ValueError, match=reason):
        auto_complete(config, path_of(add_sub), {})


def test_batching_asked_of_a_model_that_cannot_batch(fixed):
    with pytest.raises(ValueError, match="model does not support batching while non-zero "
                                         "max_batch_size is specified"):
        auto_complete(bare(max_batch_size=8), path_of(fixed), {})
    config = bare(max_batch_size=8, input=[io("INPUT0", "TYPE_FP32", [16])],
                  output=[io("OUTPUT0", "TYPE_FP32", [16])])
    with pytest.raises(ValueError, match="the first dimension must be -1"):
        auto_complete(config, path_of(fixed), {})


def test_sequence_controls_are_checked_against_the_graph(add_sub):
    controls = {"control_input": [{"name": "START", "control": [
        {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}]}
    with pytest.raises(ValueError, match="sequence control 'START', which the model"):
        auto_complete(bare(max_batch_size=4, sequence_batching=controls), path_of(add_sub), {})


# --- running on the CPU ----------------------------------------------------------


@pytest.fixture(scope="module")
def identities(tmp_path_factory):
    base = tmp_path_factory.mktemp("identities")
    return {t: om.identity(base / f"identity_{t.lower()}", t) for t in ALL_TYPES}


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_identity_of_every_datatype(identities, datatype):
    model = load(identities[datatype])
    assert model.input_names == ["INPUT0"] and model.output_names == ["OUTPUT0"]
    dtype = np.dtype(ob.datatypes.to_numpy(datatype))
    x = (np.arange(48).reshape(3, 16) % 2 if datatype == "BOOL"
         else np.arange(48).reshape(3, 16)).astype(dtype)
    out = model.run({"INPUT0": x}, ["OUTPUT0"])
    assert list(out) == ["OUTPUT0"]
    assert isinstance(out["OUTPUT0"], np.ndarray) and out["OUTPUT0"].dtype == dtype
    np.testing.assert_array_equal(out["OUTPUT0"], x)
    model.close()


def test_add_sub_all_and_some_outputs(add_sub):
    model = load(add_sub)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 5, 16), dtype=np.float32)
    out = model.run({"INPUT0": a, "INPUT1": b}, [])  # no names: every config output
    np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
    out = model.run({"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    assert list(out) == ["OUTPUT1"]
    with pytest.raises(ValueError, match="no output named 'OUTPUT9'"):
        model.run({"INPUT0": a, "INPUT1": b}, ["OUTPUT9"])


def test_inputs_are_used_in_place_and_cast_only_when_needed(add_sub):
    model = load(add_sub)
    x = np.ones((2, 16), np.float32)
    assert model._host_input("INPUT0", x) is x  # contiguous FP32: handed to ORT as is
    wide = np.arange(32, dtype=np.float64).reshape(2, 16)
    strided = np.arange(64, dtype=np.float32).reshape(2, 32)[:, ::2]
    out = model.run({"INPUT0": wide, "INPUT1": strided}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, wide + strided)


def test_mlp_matches_numpy(mlp):
    model = load(mlp)
    for batch in (1, 7):
        x = np.random.default_rng(batch).standard_normal((batch, 64), dtype=np.float32)
        got = model.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        assert got.shape == (batch, 32)
        np.testing.assert_allclose(got, om.mlp_reference(x, (64, 128, 32), seed=1),
                                   rtol=1e-4, atol=1e-4)


def test_bytes_in_and_out(repo):
    model = load(om.string_identity(repo / "bytes_id"))
    x = np.array([[b"hello"], ["h\u00e9".encode()], [b""]], dtype=object)
    got = model.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert got.dtype == object and got.shape == (3, 1)
    assert got.tolist() == [[b"hello"], ["h\u00e9".encode()], [b""]]
    with pytest.raises(InferError, match="not UTF-8") as info:
        model.run({"INPUT0": np.array([[b"\xff"]], dtype=object)}, ["OUTPUT0"])
    assert info.value.code == ErrorCode.INVALID_ARG


def test_config_reshape_applies_both_ways(repo):
    d = om.identity(repo / "reshape", "FP32")
    config = bare("reshape", max_batch_size=4,
                  input=[io("INPUT0", "TYPE_FP32", [4, 4], reshape={"shape": [16]})],
                  output=[io("OUTPUT0", "TYPE_FP32", [2, 8], reshape={"shape": [16]})])
    model = load(d, auto_complete(config, path_of(d), {}))
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4)
    got = model.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert got.shape == (2, 2, 8)
    np.testing.assert_array_equal(got.reshape(-1), x.reshape(-1))


def test_strict_config_is_validated_by_the_instance(add_sub):
    config = bare(max_batch_size=4, input=[io("INPUT0", "TYPE_FP32", [16]),
                                           io("INPUT1", "TYPE_FP64", [16])],
                  output=[io("OUTPUT0", "TYPE_FP32", [16])])
    with pytest.raises(ValueError, match="expects datatype TYPE_FP64 for input 'INPUT1'"):
        OnnxModel(config, path_of(add_sub), "cpu", {})


def test_closed_instance_refuses_to_run(add_sub):
    model = load(add_sub)
    model.close()
    with pytest.raises(RuntimeError, match="closed"):
        model.run({"INPUT0": np.ones((1, 16), np.float32)}, ["OUTPUT0"])


# --- session options and providers -----------------------------------------------


def with_params(config: dict, **params) -> dict:
    return {**config, "parameters": {k: {"string_value": v} for k, v in params.items()}}


def test_session_parameters_reach_ort(add_sub):
    config = with_params(auto_complete(bare("add_sub"), path_of(add_sub), {}),
                         intra_op_thread_count="3", inter_op_thread_count="2",
                         execution_mode="1", enable_mem_arena="0", enable_mem_pattern="false")
    config["optimization"] = {"graph": {"level": -1}}
    model = load(add_sub, config)
    for options in (model.session_options, model.session.get_session_options()):
        assert options.intra_op_num_threads == 3
        assert options.inter_op_num_threads == 2
        assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert options.enable_cpu_mem_arena is False
        assert options.enable_mem_pattern is False
    x = np.ones((1, 16), np.float32)
    np.testing.assert_array_equal(model.run({"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])["OUTPUT0"],
                                  2 * x)


@pytest.mark.parametrize("level, expected", [
    (None, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
    (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
    (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
    (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
])
def test_graph_optimization_levels_follow_triton(level, expected):
    config = bare() if level is None else bare(optimization={"graph": {"level": level}})
    options, _ = ob.session_options(config, {})
    assert options.graph_optimization_level == expected


@pytest.mark.parametrize("params, reason", [
    ({"execution_mode": "2"}, "Expected values for execution_mode are 0 or 1 but got 2"),
    ({"intra_op_thread_count": "many"}, "parameter 'intra_op_thread_count' must be an integer"),
    ({"enable_mem_arena": "maybe"}, "parameter 'enable_mem_arena' must be a boolean"),
])
def test_bad_session_parameters(params, reason):
    with pytest.raises(ValueError, match=reason):
        ob.session_options(with_params(bare(), **params), {})


def test_default_threads_share_the_cores_among_instances(monkeypatch):
    monkeypatch.setattr(ob.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(ob, "cgroup_cpu_quota", lambda: None)
    groups = [{"kind": "KIND_CPU", "count": 2}, {"kind": "KIND_GPU", "count": 3}]
    assert ob.default_intra_op_threads(bare(instance_group=groups), "cpu") == 4
    assert ob.default_intra_op_threads(bare(instance_group=groups), "cuda") == 2
    assert ob.default_intra_op_threads(bare(), "cpu") == 8
    many = [{"kind": "KIND_CPU", "count": 32}]
    assert ob.default_intra_op_threads(bare(instance_group=many), "cpu") == 1
    # a pod limited to 2 CPUs: 2 threads for one instance, not the node's 8
    monkeypatch.setattr(ob, "cgroup_cpu_quota", lambda: 2.0)
    assert ob.default_intra_op_threads(bare(), "cpu") == 2
    monkeypatch.setattr(ob, "cgroup_cpu_quota", lambda: None)
    options, _ = ob.session_options(bare(instance_group=groups), {})
    assert options.intra_op_num_threads == 4
    options, _ = ob.session_options(with_params(bare(instance_group=groups),
                                                intra_op_thread_count="6"), {})
    assert options.intra_op_num_threads == 6


def test_run_option_arena_shrinkage_is_passed():
    _, run_options = ob.session_options(
        with_params(bare(), **{"memory.enable_memory_arena_shrinkage": "cpu:0"}), {})
    assert run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"


def test_missing_cpu_accelerator_warns_and_runs_on_cpu(add_sub, caplog):
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has OpenVINO")
    config = auto_complete(bare("add_sub"), path_of(add_sub), {})
    config["optimization"] = {"execution_accelerators": {
        "cpu_execution_accelerator": [{"name": "openvino"}]}}
    with caplog.at_level(logging.WARNING, logger=ob.log.name):
        model = load(add_sub, config)
    assert "openvino accelerator, which this onnxruntime lacks" in caplog.text
    assert model.session.get_providers() == ["CPUExecutionProvider"]


def test_unknown_accelerator_is_an_error():
    config = bare(optimization={"execution_accelerators": {
        "cpu_execution_accelerator": [{"name": "quantum"}]}})
    with pytest.raises(ValueError, match="unknown Execution Accelerator 'quantum' is requested"):
        ob.execution_providers(config, "cpu")


def test_gpu_providers_and_tensorrt_parameters(monkeypatch, caplog):
    trt = {"name": "tensorrt", "parameters": {"precision_mode": "FP16",
                                              "max_workspace_size_bytes": "1073741824",
                                              "trt_engine_cache_enable": "1"}}
    config = with_params(bare(optimization={"execution_accelerators": {
        "gpu_execution_accelerator": [trt, {"name": "cuda", "parameters": {
            "cudnn_conv_use_max_workspace": "0"}}]}}), arena_extend_strategy="1")
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ob.ort, "get_available_providers", lambda: available)
    providers = ob.execution_providers(config, "cuda", 1, stream_ptr=1234)
    assert [name for name, _ in providers] == available
    assert providers[0][1] == {"device_id": "1", "trt_fp16_enable": "1",
                               "trt_max_workspace_size": "1073741824",
                               "trt_engine_cache_enable": "1", "user_compute_stream": "1234",
                               "has_user_compute_stream": "1"}
    assert providers[1][1] == {"device_id": "1", "arena_extend_strategy": "kSameAsRequested",
                               "cudnn_conv_use_max_workspace": "0",
                               "user_compute_stream": "1234", "has_user_compute_stream": "1"}
    # an onnxruntime-gpu without TensorRT: a warning, CUDA alone
    monkeypatch.setattr(ob.ort, "get_available_providers", lambda: available[1:])
    with caplog.at_level(logging.WARNING, logger=ob.log.name):
        providers = ob.execution_providers(config, "cuda", 0)
    assert "tensorrt accelerator, which this onnxruntime lacks" in caplog.text
    assert [name for name, _ in providers] == available[1:]
    assert "user_compute_stream" not in providers[0][1]
    bad = bare(optimization={"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP8"}}]}})
    monkeypatch.setattr(ob.ort, "get_available_providers", lambda: available)
    with pytest.raises(ValueError, match="unsupported precision mode 'FP8'"):
        ob.execution_providers(bad, "cuda", 0)


def test_cuda_device_without_the_provider_is_a_clear_error(add_sub):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(RuntimeError, match="onnxruntime has no CUDA execution provider; "
                                           "install the gpu extra"):
        load(add_sub, device="cuda:0")


def test_device_names():
    assert ob.parse_device("cpu") == ("cpu", 0)
    assert ob.parse_device("cuda:3") == ("cuda", 3)
    assert ob.parse_device("cuda") == ("cuda", 0)
    with pytest.raises(ValueError, match="unknown device 'tpu:0'"):
        ob.parse_device("tpu:0")


# --- GPU -------------------------------------------------------------------------


def _cuda():
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu")
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("needs a CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA device")
    return cupy


@pytest.mark.gpu
def test_gpu_device_arrays_in_and_out_on_the_instance_stream(add_sub):
    cupy = _cuda()
    stream = cupy.cuda.Stream(non_blocking=True)
    model = load(add_sub, device="cuda:0", stream_ptr=stream.ptr)
    a, b = np.random.default_rng(0).standard_normal((2, 3, 16), dtype=np.float32)
    with stream:
        da, db = cupy.asarray(a), cupy.asarray(b)
        out = model.run({"INPUT0": da, "INPUT1": db}, ["OUTPUT0", "OUTPUT1"])
    assert isinstance(out["OUTPUT0"], cupy.ndarray) and out["OUTPUT0"].device.id == 0
    np.testing.assert_allclose(cupy.asnumpy(out["OUTPUT0"]), a + b, rtol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(out["OUTPUT1"]), a - b, rtol=1e-6)
    model.close()


@pytest.mark.gpu
def test_gpu_outputs_outlive_later_runs_and_host_inputs_work(add_sub):
    cupy = _cuda()
    model = load(add_sub, device="cuda:0")
    x = np.ones((2, 16), np.float32)
    first = model.run({"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])["OUTPUT0"]  # host in
    for _ in range(3):  # later runs must not reuse the memory the first output holds
        model.run({"INPUT0": 5 * x, "INPUT1": 5 * x}, ["OUTPUT0"])
    np.testing.assert_array_equal(cupy.asnumpy(first), 2 * x)
    model.close()
    np.testing.assert_array_equal(cupy.asnumpy(first), 2 * x)  # and the session itself


@pytest.mark.gpu
def test_gpu_casts_and_strided_device_inputs(add_sub):
    cupy = _cuda()
    model = load(add_sub, device="cuda:0")
    a = cupy.arange(32, dtype=cupy.float64).reshape(2, 16)
    b = cupy.arange(64, dtype=cupy.float32).reshape(2, 32)[:, ::2]
    got = model.run({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])["OUTPUT0"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(cupy.asnumpy(got), cupy.asnumpy(a + b))


@pytest.mark.gpu
def test_gpu_mlp_and_bytes(mlp, repo):
    cupy = _cuda()
    model = load(mlp, device="cuda:0")
    x = np.random.default_rng(3).standard_normal((8, 64), dtype=np.float32)
    got = model.run({"INPUT0": cupy.asarray(x)}, [])["OUTPUT0"]
    np.testing.assert_allclose(cupy.asnumpy(got), om.mlp_reference(x, (64, 128, 32), seed=1),
                               rtol=1e-2, atol=1e-2)  # TF32 on recent GPUs
    strings = load(om.string_identity(repo / "bytes_gpu"), device="cuda:0")
    s = np.array([[b"a"], [b"bc"]], dtype=object)
    out = strings.run({"INPUT0": s}, ["OUTPUT0"])["OUTPUT0"]
    assert isinstance(out, np.ndarray) and out.tolist() == [[b"a"], [b"bc"]]


def test_onnxruntime_session_settings_pass_through_and_spinning_is_off_by_default():
    options, _ = ob.session_options({"name": "m"}, {})
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    config = {"name": "m", "parameters": {
        "session.intra_op.allow_spinning": {"string_value": "1"},
        "session.inter_op.allow_spinning": {"string_value": "0"}}}
    options, _ = ob.session_options(config, {})
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"


# --- ragged batching: batch inputs and outputs in the config ----------------------


@pytest.fixture(scope="module")
def ragged(repo):
    return om.ragged_sums(repo / "ragged", config="")


RAGGED_IO = {
    "max_batch_size": 8,
    "input": [io("INPUT", "TYPE_FP32", [-1], allow_ragged_batch=True)],
    "batch_input": [
        {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["INDEX"],
         "data_type": "TYPE_INT32", "source_input": ["INPUT"]},
        {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["COUNT"],
         "data_type": "TYPE_INT32", "source_input": ["INPUT"]}],
    "output": [io("SUM", "TYPE_FP32", [1]), io("COUNT_OUT", "TYPE_INT32", [1]),
               io("DOUBLED", "TYPE_FP32", [-1])],
    "batch_output": [{"target_name": ["DOUBLED"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                      "source_input": ["INPUT"]}],
}


def test_batch_input_targets_are_graph_inputs_the_config_need_not_list(ragged):
    """Graph inputs fed by batch inputs count toward the inputs the config describes;
    a ragged input is 1-D [-1] in the graph; a batch output's shape is not compared."""
    config = bare(**copy.deepcopy(RAGGED_IO))
    assert auto_complete(config, path_of(ragged), {}) == config


def test_auto_complete_leaves_batch_input_targets_out_of_the_inputs(ragged):
    """Inputs completed from the graph skip the ones batch inputs feed."""
    config = bare(**{k: v for k, v in copy.deepcopy(RAGGED_IO).items()
                     if k not in ("input", "output")})
    out = auto_complete(config, path_of(ragged), {})
    assert [i["name"] for i in out["input"]] == ["INPUT"]
    assert [o["name"] for o in out["output"]] == ["SUM", "COUNT_OUT", "DOUBLED"]


@pytest.mark.parametrize("change, reason", [
    (lambda c: c["batch_input"].pop(),
     "configuration expects 2 inputs, model provides 3"),
    (lambda c: c["batch_input"][0].update(data_type="TYPE_FP32"),
     "configuration expects datatype TYPE_FP32 for batch input 'INDEX', model provides "
     "TYPE_INT32"),
    (lambda c: c["batch_input"][1].update(target_name=["NOPE"]),
     "configuration names batch input 'NOPE', which the model does not have"),
    (lambda c: c["input"][0].update(dims=[4]) or c["input"][0].pop("allow_ragged_batch"),
     "the model expects 1 dimensions"),
])
def test_batch_io_contradicting_the_graph_is_rejected(ragged, change, reason):
    config = bare(**copy.deepcopy(RAGGED_IO))
    change(config)
    with pytest.raises(ValueError, match=reason):
        auto_complete(config, path_of(ragged), {})
