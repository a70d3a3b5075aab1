"""Tiny ONNX models, built with the `onnx` package into Triton model directories.

Each builder writes `<model_dir>/1/model.onnx` (and `config.pbtxt` when given its text)
and returns the model directory. Opset 17 and IR version 8 load on onnxruntime 1.17+.
Batched models name their first dimension "batch", a symbolic dimension, as exporters do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from shm import datatypes

OPSET = 17
IR_VERSION = 8  # onnx 1.12's IR; onnxruntime 1.17 reads up to 9

# Triton datatype -> ONNX element type
_ELEM = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _datatype(dtype) -> str:
    """Triton datatype name of `dtype`: a name ("FP32", "TYPE_FP32") or a numpy dtype."""
    if isinstance(dtype, str):
        name = datatypes.from_config(dtype.upper())
        if name in _ELEM:
            return name
    return datatypes.from_numpy(np.dtype(dtype))


def _write(model_dir, graph, config: str | None) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="shmserve-tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    model_dir = Path(model_dir)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def _shape(dims, dynamic_batch: bool) -> list:
    return (["batch"] if dynamic_batch else []) + list(dims)


def identity(model_dir, dtype="FP32", dynamic_batch: bool = True, dims=(16,),
             config: str | None = None) -> Path:
    """OUTPUT0 = INPUT0, of `dtype`; shape ["batch", *dims] or just `dims`."""
    elem = _ELEM[_datatype(dtype)]
    shape = _shape(dims, dynamic_batch)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)])
    return _write(model_dir, graph, config)


def string_identity(model_dir, dynamic_batch: bool = True, dims=(1,),
                    config: str | None = None) -> Path:
    """OUTPUT0 = INPUT0 for BYTES (ONNX string) tensors."""
    return identity(model_dir, "BYTES", dynamic_batch, dims, config)


def add_sub(model_dir, config: str | None = None) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; FP32 ["batch", 16]."""
    shape = ["batch", 16]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
         for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
         for n in ("OUTPUT0", "OUTPUT1")])
    return _write(model_dir, graph, config)


def mlp_weights(sizes=(512, 2048, 512), seed: int = 0) -> list[np.ndarray]:
    """[W1, b1, W2, b2, ...] float32, W scaled by 1/sqrt(fan_in) so outputs stay O(1)."""
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        weights.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))
                       .astype(np.float32))
        weights.append((rng.standard_normal(fan_out) * 0.1).astype(np.float32))
    return weights


def mlp_reference(x: np.ndarray, sizes=(512, 2048, 512), seed: int = 0) -> np.ndarray:
    """What `mlp(dir, sizes, seed)` computes, in numpy."""
    weights = mlp_weights(sizes, seed)
    y = x.astype(np.float32)
    for i in range(0, len(weights), 2):
        y = y @ weights[i] + weights[i + 1]
        if i + 2 < len(weights):
            y = np.maximum(y, 0)
    return y


def mlp(model_dir, sizes=(512, 2048, 512), seed: int = 0,
        config: str | None = None) -> Path:
    """INPUT0 ["batch", sizes[0]] -> Gemm, Relu, ..., Gemm -> OUTPUT0 ["batch", sizes[-1]],
    with random weights (see mlp_weights)."""
    weights = mlp_weights(sizes, seed)
    inits, nodes, x = [], [], "INPUT0"
    layers = len(weights) // 2
    for i in range(layers):
        w, b = f"W{i}", f"B{i}"
        inits += [numpy_helper.from_array(weights[2 * i], w),
                  numpy_helper.from_array(weights[2 * i + 1], b)]
        y = "OUTPUT0" if i == layers - 1 else f"gemm{i}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [y]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"]))
            y = f"relu{i}"
        x = y
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=inits)
    return _write(model_dir, graph, config)


RAGGED_SUMS_CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
dynamic_batching {{ }}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32
     source_input: "INPUT" }},
  {{ kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32
     source_input: "INPUT" }}
]
output [
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "COUNT_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_output [
  {{ target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def ragged_sums(model_dir, config: str | None = None) -> Path:
    """A ragged-batching model, as Triton's ragged batching doc describes one.

    INPUT FP32 ["total"] is the requests' elements concatenated; INDEX INT32
    ["requests"] (BATCH_ACCUMULATED_ELEMENT_COUNT) says where each request ends; COUNT
    INT32 ["requests"] (BATCH_ELEMENT_COUNT) each request's element count. Outputs:
    SUM ["requests", 1] each request's sum (differences of a cumulative sum at INDEX),
    COUNT_OUT ["requests", 1] = COUNT, and DOUBLED ["total"] = 2 * INPUT, which the
    config scatters back with BATCH_SCATTER_WITH_INPUT_SHAPE. With `config` None the
    config is RAGGED_SUMS_CONFIG named after the directory.
    """
    model_dir = Path(model_dir)
    if config is None:
        config = RAGGED_SUMS_CONFIG.format(name=model_dir.name)
    i64 = TensorProto.INT64
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor(
            "zero", TensorProto.FLOAT, [1], [0.0])),
        helper.make_node("Constant", [], ["axis0"], value=helper.make_tensor(
            "axis0", i64, [], [0])),
        helper.make_node("Constant", [], ["first"], value=helper.make_tensor(
            "first", i64, [1], [0])),
        helper.make_node("Constant", [], ["but_last"], value=helper.make_tensor(
            "but_last", i64, [1], [-1])),
        helper.make_node("Constant", [], ["axes1"], value=helper.make_tensor(
            "axes1", i64, [1], [1])),
        # csum[k] = sum of the first k elements, so a request's sum is
        # csum[end] - csum[previous end]
        helper.make_node("Concat", ["zero", "INPUT"], ["padded"], axis=0),
        helper.make_node("CumSum", ["padded", "axis0"], ["csum"]),
        helper.make_node("Gather", ["csum", "INDEX"], ["at_ends"], axis=0),
        helper.make_node("Slice", ["at_ends", "first", "but_last"], ["before"]),
        helper.make_node("Concat", ["zero", "before"], ["at_starts"], axis=0),
        helper.make_node("Sub", ["at_ends", "at_starts"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axes1"], ["SUM"]),
        helper.make_node("Unsqueeze", ["COUNT", "axes1"], ["COUNT_OUT"]),
        helper.make_node("Add", ["INPUT", "INPUT"], ["DOUBLED"]),
    ]
    graph = helper.make_graph(
        nodes, "ragged_sums",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["total"]),
         helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["requests"]),
         helper.make_tensor_value_info("COUNT", TensorProto.INT32, ["requests"])],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["requests", 1]),
         helper.make_tensor_value_info("COUNT_OUT", TensorProto.INT32, ["requests", 1]),
         helper.make_tensor_value_info("DOUBLED", TensorProto.FLOAT, ["total"])])
    return _write(model_dir, graph, config)


def accumulator(model_dir, config: str | None = None) -> Path:
    """A stateful INT32 accumulator for the sequence batcher: OUTPUT = ACC_IN + INPUT,
    ACC_OUT (the implicit state's output, not a config output) = OUTPUT, and
    START_OUT = START (the control the server made); all ["batch", 1]."""
    shape = ["batch", 1]
    graph = helper.make_graph(
        [helper.make_node("Add", ["ACC_IN", "INPUT"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
         helper.make_node("Identity", ["START"], ["START_OUT"])], "accumulator",
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape)
         for n in ("INPUT", "START", "ACC_IN")],
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape)
         for n in ("OUTPUT", "ACC_OUT", "START_OUT")])
    return _write(model_dir, graph, config)
