"""Tests for workers.torch_backend: Triton's pytorch-backend rules on tiny TorchScript
models the tests build (tests/torch_models.py), run on the CPU; GPU tests need CUDA."""

import logging
import warnings
from typing import Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shm.errors import ErrorCode, InferError  # noqa: E402
from tests import torch_models as tm  # noqa: E402
from workers.torch_backend import TorchModel  # noqa: E402

# TorchScript is what Triton's pytorch backend serves, deprecated or not.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*is deprecated:DeprecationWarning")


def load(model_dir, device="cpu", backend_config=None, **kwargs) -> TorchModel:
    return TorchModel(tm.config_json(model_dir), str(model_dir / "1" / "model.pt"),
                      device, backend_config or {}, **kwargs)


def pair(batch=3, dims=16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, dims), dtype=np.float32),
            rng.standard_normal((batch, dims), dtype=np.float32))


@pytest.fixture(scope="module")
def scripted_identity():
    return torch.jit.script(tm.Identity())


@pytest.fixture(scope="module")
def add_sub_index(tmp_path_factory):
    return tm.add_sub(tmp_path_factory.mktemp("repo") / "add_sub", naming="index")


# --- naming conventions ---------------------------------------------------------------


def test_named_index_inputs_and_outputs(add_sub_index):
    model = load(add_sub_index)
    assert model.input_names == ["INPUT__0", "INPUT__1"]
    assert model.output_names == ["OUTPUT__0", "OUTPUT__1"]
    a, b = pair()
    out = model.run({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
    np.testing.assert_allclose(out["OUTPUT__0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], a - b, rtol=1e-6)
    # only the requested outputs come back
    assert list(model.run({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__1"])) == ["OUTPUT__1"]
    model.close()


def test_named_index_ignores_config_order(tmp_path):
    # INPUT__1 listed first still feeds argument 1; OUTPUT__1 listed first is still a - b.
    d = tm.save_model(tmp_path / "m", tm.AddSub(),
                      [("INPUT__1", "TYPE_FP32", [4]), ("INPUT__0", "TYPE_FP32", [4])],
                      [("OUTPUT__1", "TYPE_FP32", [4]), ("OUTPUT__0", "TYPE_FP32", [4])])
    a, b = pair(dims=4)
    out = load(d).run({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
    np.testing.assert_allclose(out["OUTPUT__0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], a - b, rtol=1e-6)


def test_forward_argument_names(tmp_path):
    built = tm.add_sub(tmp_path / "by_arg", naming="argument", dims=4)
    a, b = pair(dims=4)
    out = load(built).run({"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
    # listed in the other order, inputs still go by argument name
    d = tm.save_model(tmp_path / "swapped", tm.AddSubByName(),
                      [("INPUT1", "TYPE_FP32", [4]), ("INPUT0", "TYPE_FP32", [4])],
                      [("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])])
    out = load(d).run({"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)


def test_other_names_fall_back_to_config_order(tmp_path, caplog):
    # Neither forward() names nor <name>__<index>: config order, as in Triton, which
    # warns when a name has "__" but no index after it.
    d = tm.save_model(tmp_path / "m", tm.AddSub(),
                      [("Y__b", "TYPE_FP32", [4]), ("X__a", "TYPE_FP32", [4])],
                      [("D", "TYPE_FP32", [4]), ("S", "TYPE_FP32", [4])])
    with caplog.at_level(logging.WARNING, logger="shmserve.pytorch"):
        model = load(d)
    assert "input(s) of the model 'm'" in caplog.text and "strict ordering" in caplog.text
    assert "output(s)" not in caplog.text  # plain names fall back silently
    a, b = pair(dims=4)
    out = model.run({"Y__b": a, "X__a": b}, ["D", "S"])
    np.testing.assert_allclose(out["D"], a + b, rtol=1e-6)  # element 0 of the tuple
    np.testing.assert_allclose(out["S"], a - b, rtol=1e-6)


def test_dict_input(tmp_path):
    model = load(tm.dict_input(tmp_path / "m"))
    a, b = pair(dims=4)
    out = model.run({"INPUT_A": a, "INPUT_B": b}, ["OUTPUT__0", "OUTPUT__1"])
    np.testing.assert_allclose(out["OUTPUT__0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], a - b, rtol=1e-6)


def test_dict_output_maps_by_key(tmp_path):
    model = load(tm.dict_output(tmp_path / "m"))
    a, b = pair(dims=4)
    out = model.run({"INPUT__0": a, "INPUT__1": b}, ["SUM", "DIFF"])
    np.testing.assert_allclose(out["SUM"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["DIFF"], a - b, rtol=1e-6)


@pytest.mark.parametrize("inputs, reason", [
    # two config inputs with the same index: argument 1 would get nothing
    ([("A__0", "TYPE_FP32", [4]), ("B__0", "TYPE_FP32", [4])], "exactly once"),
    # an index past forward()'s arguments
    ([("INPUT__0", "TYPE_FP32", [4]), ("INPUT__2", "TYPE_FP32", [4])], "exactly once"),
    # one input for two arguments
    ([("INPUT__0", "TYPE_FP32", [4])], "configuration expects 1 inputs, model provides 2"),
    ([], "must contain at least one input"),
    ([("INPUT__0", "TYPE_UINT32", [4]), ("INPUT__1", "TYPE_FP32", [4])],
     "unsupported datatype TYPE_UINT32 for input 'INPUT__0'"),
])
def test_bad_input_bindings_fail_at_load(tmp_path, inputs, reason):
    d = tm.save_model(tmp_path / "m", tm.AddSub(), inputs,
                      [("OUTPUT__0", "TYPE_FP32", [4])])
    config = tm.config_json(d) if inputs else {"name": "m", "input": [], "output": [
        {"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [4]}]}
    with pytest.raises(ValueError, match=reason):
        TorchModel(config, str(d / "1" / "model.pt"), "cpu", {})


class TakesInt(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n


def test_non_tensor_argument_fails_at_load(tmp_path):
    d = tm.save_model(tmp_path / "m", TakesInt(),
                      [("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_INT64", [1])],
                      [("OUTPUT__0", "TYPE_FP32", [4])])
    with pytest.raises(ValueError, match="An input of type 'int' was detected"):
        load(d)


def test_missing_model_file_and_bad_parameter(tmp_path, add_sub_index):
    config = tm.config_json(add_sub_index)
    with pytest.raises(FileNotFoundError, match="unable to find"):
        TorchModel(config, str(tmp_path / "nope.pt"), "cpu", {})
    config["parameters"] = {"INFERENCE_MODE": {"string_value": "maybe"}}
    with pytest.raises(ValueError, match="failed to convert 'maybe' to boolean"):
        TorchModel(config, str(add_sub_index / "1" / "model.pt"), "cpu", {})


def test_output_index_past_the_tuple_fails_at_run(tmp_path):
    d = tm.save_model(tmp_path / "m", tm.AddSub(),
                      [("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_FP32", [4])],
                      [("OUTPUT__2", "TYPE_FP32", [4])])
    a, b = pair(dims=4)
    with pytest.raises(InferError, match="refers to an output index which doesn't exist. "
                                         "This model has 2 outputs"):
        load(d).run({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__2"])


def test_output_datatype_must_match_config(tmp_path, scripted_identity):
    # config says INT32 for both, but an FP32 array fed in comes back FP32
    model = load(tm.identity(tmp_path / "m", "TYPE_INT32", scripted=scripted_identity))
    with pytest.raises(InferError) as info:
        model.run({"INPUT__0": np.ones((1, 3), np.float32)}, ["OUTPUT__0"])
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', model " \
           "provides TYPE_FP32" in info.value.message


def test_unknown_and_missing_tensors_at_run(add_sub_index):
    model = load(add_sub_index)
    a, b = pair()
    with pytest.raises(InferError, match="unexpected inference input 'EXTRA'"):
        model.run({"INPUT__0": a, "INPUT__1": b, "EXTRA": a}, ["OUTPUT__0"])
    with pytest.raises(InferError, match="input 'INPUT__1' is missing"):
        model.run({"INPUT__0": a}, ["OUTPUT__0"])
    with pytest.raises(InferError, match="unexpected inference output 'NOPE'"):
        model.run({"INPUT__0": a, "INPUT__1": b}, ["NOPE"])


def test_model_errors_are_execute_failures(add_sub_index):
    model = load(add_sub_index)
    a, _ = pair()
    with pytest.raises(InferError, match="PyTorch execute failure") as info:
        model.run({"INPUT__0": a, "INPUT__1": np.ones((2, 5), np.float32)}, ["OUTPUT__0"])
    assert info.value.code == ErrorCode.INTERNAL


class Gate(torch.nn.Module):
    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return x * start.to(x.dtype)


@pytest.mark.parametrize("control, error", [("START__1", None),
                                            ("START", "does not follow <name>__<index>")])
def test_sequence_controls_are_named_inputs(tmp_path, control, error):
    sequence = ("sequence_batching { control_input [ { name: \"%s\" control [ { kind: "
                "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }" % control)
    d = tm.save_model(tmp_path / "m", Gate(), [("INPUT__0", "TYPE_FP32", [2])],
                      [("OUTPUT__0", "TYPE_FP32", [2])], extra=sequence)
    if error:
        with pytest.raises(ValueError, match=error):
            load(d)
        return
    model = load(d)
    assert model.input_names == ["INPUT__0", "START__1"]
    x = np.full((1, 2), 3.0, np.float32)
    out = model.run({"INPUT__0": x, "START__1": np.ones((1, 1), np.int32)}, ["OUTPUT__0"])
    assert out["OUTPUT__0"].tolist() == [[3.0, 3.0]]


# --- parameters -------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (None, [True, False]),     # Triton's default: inference mode on
    ("true", [True, False]),
    ("false", [False, False]),  # no_grad only
])
def test_inference_mode_parameter(tmp_path, value, expected):
    model = load(tm.mode_probe(tmp_path / "m", value))
    out = model.run({"INPUT__0": np.ones(1, np.float32)}, ["OUTPUT__0"])
    assert out["OUTPUT__0"].tolist() == expected


@pytest.mark.parametrize("disable, optimized", [(None, True), ("true", False)])
def test_disable_optimized_execution_is_per_call(tmp_path, scripted_identity, disable,
                                                 optimized):
    params = {"DISABLE_OPTIMIZED_EXECUTION": disable} if disable else None
    model = load(tm.identity(tmp_path / "m", parameters=params, scripted=scripted_identity))
    seen = []
    forward = model._forward

    def spy(*args):
        seen.append(torch._C._get_graph_executor_optimize())
        return forward(*args)

    model._forward = spy
    model.run({"INPUT__0": np.ones((1, 2), np.float32)}, ["OUTPUT__0"])
    assert seen == [optimized]
    assert torch._C._get_graph_executor_optimize() is True  # restored after the call


def test_weight_sharing(tmp_path, scripted_identity):
    shared = tm.identity(tmp_path / "shared", parameters={"ENABLE_WEIGHT_SHARING": "true"},
                         scripted=scripted_identity)
    one, two = load(shared), load(shared)
    assert one.module is two.module
    one.close()
    assert two.run({"INPUT__0": np.ones((1, 2), np.float32)}, ["OUTPUT__0"])["OUTPUT__0"] \
        .tolist() == [[1.0, 1.0]]
    two.close()
    plain = tm.identity(tmp_path / "plain", scripted=scripted_identity)
    assert load(plain).module is not load(plain).module


# --- datatypes and memory ---------------------------------------------------------


@pytest.mark.parametrize("data_type, dtype", [
    ("TYPE_FP32", np.float32), ("TYPE_FP16", np.float16), ("TYPE_FP64", np.float64),
    ("TYPE_INT8", np.int8), ("TYPE_INT16", np.int16), ("TYPE_INT32", np.int32),
    ("TYPE_INT64", np.int64), ("TYPE_UINT8", np.uint8), ("TYPE_BOOL", np.bool_),
    ("TYPE_BF16", np.uint16),  # BF16 travels as uint16 words
])
def test_datatypes_round_trip(tmp_path, scripted_identity, data_type, dtype):
    model = load(tm.identity(tmp_path / "m", data_type, scripted=scripted_identity))
    x = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    if dtype is np.uint16:
        x = np.array([[0x3F80, 0x4000, 0xBF80]] * 2, np.uint16)  # 1.0, 2.0, -1.0
    out = model.run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.dtype == x.dtype and out.shape == x.shape
    np.testing.assert_array_equal(out, x)


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_bf16_inputs_are_bfloat16_tensors(tmp_path):
    d = tm.save_model(tmp_path / "m", Double(),
                      [("INPUT__0", "TYPE_BF16", [3])], [("OUTPUT__0", "TYPE_BF16", [3])])
    words = np.array([[0x3F80, 0x4000, 0xBF80]], np.uint16)  # 1.0, 2.0, -1.0
    out = load(d).run({"INPUT__0": words}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.tolist() == [[0x4000, 0x4080, 0xC000]]  # 2.0, 4.0, -2.0


def test_read_only_inputs_are_not_copied(tmp_path, scripted_identity):
    model = load(tm.identity(tmp_path / "m", scripted=scripted_identity))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x.flags.writeable = False  # as a view over read-only shared memory is
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    assert not [w for w in caught if "not writable" in str(w.message)]
    # identity: the output is the input's own memory, so neither side was copied
    assert np.shares_memory(out, x)
    assert not out.flags.writeable


def test_mlp_matches_numpy(tmp_path):
    # 32-128-32, not the bench's 512-2048-512: the same layers and backend path at a
    # sixty-fourth of the weights to build, save, load and check
    d = tm.mlp(tmp_path / "mlp", (32, 128, 32))
    x = np.random.default_rng(1).standard_normal((4, 32), dtype=np.float32)
    out = load(d).run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.shape == (4, 32) and out.dtype == np.float32
    np.testing.assert_allclose(out, tm.mlp_reference(d, x), rtol=1e-4, atol=1e-4)


def test_string_lists(tmp_path):
    model = load(tm.string_upper(tmp_path / "m"))
    text = np.array([b"abc", "d\u00e9f".encode()], dtype=object)
    out = model.run({"TEXT__0": text}, ["UPPER__0"])["UPPER__0"]
    # UTF-8 in and out; TorchScript's upper() changes ASCII letters only
    assert out.tolist() == [b"ABC", "D\u00e9F".encode()]


def test_batched_strings_are_refused(tmp_path):
    d = tm.save_model(tmp_path / "m", tm.Upper(), [("TEXT__0", "TYPE_STRING", [1])],
                      [("UPPER__0", "TYPE_STRING", [1])], max_batch_size=4)
    with pytest.raises(ValueError, match="only supports 1 dimensional List of String"):
        load(d)


# --- GPU --------------------------------------------------------------------------


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_gpu_device_arrays_in_and_out(add_sub_index):
    cupy = _cuda()
    stream = cupy.cuda.Stream(non_blocking=True)
    model = load(add_sub_index, "cuda:0", stream_ptr=stream.ptr)
    a, b = pair()
    out = model.run({"INPUT__0": cupy.asarray(a), "INPUT__1": cupy.asarray(b)},
                    ["OUTPUT__0", "OUTPUT__1"])
    assert isinstance(out["OUTPUT__0"], cupy.ndarray)
    assert out["OUTPUT__0"].device.id == 0
    np.testing.assert_allclose(cupy.asnumpy(out["OUTPUT__0"]), a + b, rtol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(out["OUTPUT__1"]), a - b, rtol=1e-6)
    model.close()


@pytest.mark.gpu
def test_gpu_host_inputs_and_zero_copy_device_inputs(tmp_path, scripted_identity):
    cupy = _cuda()
    model = load(tm.identity(tmp_path / "m", scripted=scripted_identity), "cuda:0")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = model.run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]  # host in, device out
    np.testing.assert_array_equal(cupy.asnumpy(out), x)
    dev = cupy.asarray(x)
    out = model.run({"INPUT__0": dev}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.data.ptr == dev.data.ptr  # identity on the device: no copy either way


@pytest.mark.gpu
def test_gpu_mlp_matches_numpy(tmp_path):
    cupy = _cuda()
    d = tm.mlp(tmp_path / "mlp")
    x = np.random.default_rng(2).standard_normal((8, 512), dtype=np.float32)
    out = load(d, "cuda:0").run({"INPUT__0": cupy.asarray(x)}, ["OUTPUT__0"])["OUTPUT__0"]
    np.testing.assert_allclose(cupy.asnumpy(out), tm.mlp_reference(d, x), rtol=1e-3,
                               atol=1e-3)


class _DoubleAndShape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x * 2, torch.tensor(x.shape).unsqueeze(0).expand(x.shape[0], -1)


def test_config_reshape(tmp_path):
    """Config `reshape`, as Triton's core applies it for the pytorch backend: an input
    given in `dims` ([3, 4]) reaches forward() as `reshape.shape` ([3, 2, 2]); an output
    the model returns in its reshape shape comes back in `dims` ([3, 4])."""
    model_dir = tm.save_model(
        tmp_path / "reshaped", _DoubleAndShape(), [("INPUT__0", "TYPE_FP32", [4])],
        [("OUTPUT__0", "TYPE_FP32", [4]), ("OUTPUT__1", "TYPE_INT64", [3])])
    text = (model_dir / "config.pbtxt").read_text()
    text = text.replace('name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }',
                        'name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] '
                        'reshape { shape: [ 2, 2 ] } }')
    text = text.replace('name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }',
                        'name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] '
                        'reshape { shape: [ 2, 2 ] } }')
    assert text.count("reshape {") == 2
    (model_dir / "config.pbtxt").write_text(text)
    model = load(model_dir)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = model.run({"INPUT__0": x}, ["OUTPUT__0", "OUTPUT__1"])
    assert out["OUTPUT__1"].tolist() == [[3, 2, 2]] * 3
    assert out["OUTPUT__0"].shape == (3, 4)
    np.testing.assert_array_equal(out["OUTPUT__0"], x * 2)
