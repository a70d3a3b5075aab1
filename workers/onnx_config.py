"""onnxruntime models' configs: Triton's auto-complete from the graph, and the checks
of a config against the graph (src/onnxruntime.cc: AutoCompleteConfig, ValidateInputs,
ValidateOutputs). Errors a user can fix in the config are ValueError, worded as Triton
words them where it has a wording."""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from shm import datatypes

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 4
WILDCARD_DIM = -1

# ORT type strings -> Triton datatypes (the types a Triton config can name)
_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}

@dataclass
class TensorInfo:
    """One graph input or output: Triton datatype and dims, -1 where not fixed."""

    name: str
    datatype: str
    dims: list[int]


@dataclass
class GraphIO:
    """What a session says about its graph, in graph order."""

    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    # initializers a request may override; Triton accepts them as inputs
    overridable: dict[str, TensorInfo]

    @classmethod
    def of(cls, session) -> "GraphIO":
        def infos(args):
            return {a.name: _tensor_info(a) for a in args}
        return cls(infos(session.get_inputs()), infos(session.get_outputs()),
                   infos(session.get_overridable_initializers()))


def _tensor_info(arg) -> TensorInfo:
    datatype = _ORT_TYPES.get(arg.type)
    if datatype is None:
        raise ValueError(f"'{arg.name}' has ONNX type {arg.type}, which a Triton config "
                         "cannot describe")
    # symbolic (str) and unknown (None) dimensions are variable-size
    dims = [d if isinstance(d, int) and d >= 0 else WILDCARD_DIM for d in (arg.shape or [])]
    return TensorInfo(arg.name, datatype, dims)


def model_file(model_path: str | os.PathLike) -> str:
    """The ONNX file: `model_path` itself, or `model.onnx` inside it when it is a
    directory (Triton's rule for a model stored as a directory)."""
    path = Path(model_path)
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise ValueError(f"unable to find '{path}'")
    return str(path)


# --- auto-complete and validation --------------------------------------------------


def complete(config: dict, graph: "GraphIO", backend_config: dict[str, str]) -> dict:
    """Triton's onnxruntime-backend auto-complete: returns a new config dict.

    As Triton does, a config that lists both inputs and outputs is only checked against
    the graph; otherwise max_batch_size is completed from the graph (the backend's
    `default-max-batch-size`, 4 unless set, when every graph input and output has a
    variable first dimension; dynamic batching is turned on when the result is > 1 and
    no scheduler is named) and the missing inputs or outputs are filled in.
    """
    config = copy.deepcopy(config)
    inputs = config.get("input") or []
    outputs = config.get("output") or []
    if inputs and outputs:
        log.info("skipping model configuration auto-complete for '%s': inputs and outputs "
                 "already specified", config.get("name", ""))
    else:
        _complete_max_batch(config, graph, backend_config)
        if not inputs:
            # graph inputs that batch inputs feed are the server's, not the client's
            targets = _batch_input_targets(config)
            config["input"] = _complete_io(config, {n: t for n, t in graph.inputs.items()
                                                    if n not in targets})
        if not outputs:
            config["output"] = _complete_io(config, graph.outputs)
    validate(config, graph)
    return config


def _complete_max_batch(config: dict, graph: GraphIO, backend_config: dict) -> None:
    name = config.get("name", "")
    tensors = [*graph.inputs.values(), *graph.outputs.values()]
    can_batch = all(t.dims and t.dims[0] == WILDCARD_DIM for t in tensors)
    max_batch = int(config.get("max_batch_size") or 0)
    if not can_batch:
        if max_batch != 0:
            raise ValueError(f"autofill failed for model '{name}': model does not support "
                             "batching while non-zero max_batch_size is specified")
        return
    if max_batch == 0:
        default = backend_config.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
        max_batch = max(to_int(default, "backend config 'default-max-batch-size'"), 0)
        config["max_batch_size"] = max_batch
        log.warning("autofilled max_batch_size to %d for model '%s' since batching is "
                    "supported but no max_batch_size is specified in model configuration",
                    max_batch, name)
    if max_batch > 1 and "dynamic_batching" not in config \
            and "sequence_batching" not in config:
        config["dynamic_batching"] = {}


def _complete_io(config: dict, infos: dict[str, TensorInfo]) -> list[dict]:
    batched = int(config.get("max_batch_size") or 0) > 0
    ios = []
    for info in infos.values():
        io = {"name": info.name, "data_type": datatypes.to_config(info.datatype)}
        dims = info.dims[1:] if batched else list(info.dims)
        if not dims:
            # A scalar: Triton gives it dims [1], and with batching a reshape to [].
            dims = [1]
            if batched:
                io["reshape"] = {"shape": []}
        io["dims"] = dims
        ios.append(io)
    return ios


def validate(config: dict, graph: GraphIO) -> None:
    """Raise ValueError where the config contradicts the graph (Triton's ValidateInputs,
    ValidateOutputs and sequence-control checks)."""
    name = config.get("name", "")
    max_batch = int(config.get("max_batch_size") or 0)
    inputs = config.get("input") or []
    expected = sum(1 for io in inputs if not io.get("optional"))
    batch_targets = _batch_input_targets(config)
    expected += len(batch_targets)
    seq = config.get("sequence_batching")
    if seq is not None:
        expected += _validate_sequence(name, seq, graph, max_batch)
    if len(graph.inputs) != expected:
        raise ValueError(f"unable to load model '{name}', configuration expects {expected} "
                         f"inputs, model provides {len(graph.inputs)}")
    model_inputs = {**graph.inputs, **graph.overridable}
    batch_outputs = {n for b in config.get("batch_output") or []
                     for n in b.get("target_name") or []}
    for io in inputs:
        if io.get("optional") and max_batch != 0:
            raise ValueError(f"unable to load model '{name}', optional input '{io['name']}' "
                             "is not supported for models that support batching")
        info = _find(name, "input", io.get("name", ""), io.get("data_type"), model_inputs,
                     "inputs")
        dims = _config_shape(io)
        if io.get("allow_ragged_batch"):
            if info.dims != [WILDCARD_DIM]:
                raise ValueError(
                    f"unable to load model '{name}', configuration expects model provides "
                    f"input with shape [-1] for ragged input '{info.name}', model provides "
                    f"{_shape_str(info.dims)}")
        else:
            _compare_dims(name, info, dims, max_batch, exact=False)
    for target, data_type in batch_targets.items():
        _find(name, "batch input", target, data_type, graph.inputs, "inputs")
    for io in config.get("output") or []:
        info = _find(name, "output", io.get("name", ""), io.get("data_type"), graph.outputs,
                     "outputs")
        if info.name not in batch_outputs:
            _compare_dims(name, info, _config_shape(io), max_batch, exact=True)
    for state in (seq or {}).get("state") or []:
        _find(name, "input state", state.get("input_name", ""), state.get("data_type"),
              model_inputs, "inputs")
        _find(name, "output state", state.get("output_name", ""), state.get("data_type"),
              graph.outputs, "outputs")


def _batch_input_targets(config: dict) -> dict[str, str]:
    """{model input a batch input feeds: its config data type}."""
    return {target: b.get("data_type") or "TYPE_INVALID"
            for b in config.get("batch_input") or [] for target in b.get("target_name") or []}


def _find(model: str, kind: str, io_name: str, data_type, tensors: dict[str, TensorInfo],
          where: str) -> TensorInfo:
    """The graph tensor a config entry names, with the datatype the config gives."""
    info = tensors.get(io_name)
    if info is None:
        allowed = ", ".join(tensors) or "none"
        raise ValueError(f"unable to load model '{model}', configuration names {kind} "
                         f"'{io_name}', which the model does not have (model {where}: "
                         f"{allowed})")
    wanted = datatypes.from_config(str(data_type or ""))
    if wanted != info.datatype:
        raise ValueError(f"unable to load model '{model}', configuration expects datatype "
                         f"{data_type} for {kind} '{io_name}', model provides "
                         f"{datatypes.to_config(info.datatype)}")
    return info


def _compare_dims(model: str, info: TensorInfo, dims: list[int], max_batch: int,
                  exact: bool) -> None:
    """Triton's CompareDimsSupported; a graph scalar accepts only dims of 1s."""
    if not info.dims:
        if any(d != 1 for d in dims):
            raise ValueError(
                f"unable to load model '{model}', scalar tensor '{info.name}', should only "
                "provide 1 in the model configuration when the model doesn't support "
                f"batching. Model configuration provided: {_shape_str(dims)}.")
        return
    where = f"model '{model}', tensor '{info.name}': "
    if max_batch > 0:
        if info.dims[0] != WILDCARD_DIM:
            raise ValueError(where + "for the model to support batching the shape should "
                             "have at least 1 dimension and the first dimension must be -1; "
                             f"but shape expected by the model is {_shape_str(info.dims)}")
        full = [WILDCARD_DIM, *dims]
    else:
        full = dims
    ok = len(info.dims) == len(full) and all(
        m == d for m, d in zip(info.dims, full) if exact or m != WILDCARD_DIM)
    if not ok:
        detail = (f"{len(full)} dimensions (an initial batch dimension because "
                  "max_batch_size > 0 followed by the explicit tensor shape, making "
                  f"complete shape {_shape_str(full)})" if max_batch > 0
                  else f"{len(full)} dimensions (shape {_shape_str(full)})")
        raise ValueError(where + f"the model expects {len(info.dims)} dimensions (shape "
                         f"{_shape_str(info.dims)}) but the model configuration specifies "
                         + detail)


def _validate_sequence(model: str, seq: dict, graph: GraphIO, max_batch: int) -> int:
    """Check the control tensors the model takes; returns how many inputs the sequence
    batcher adds (controls and states)."""
    added = 0
    for control_input in seq.get("control_input") or []:
        for control in control_input.get("control") or []:
            if control.get("int32_false_true"):
                datatype = "TYPE_INT32"
            elif control.get("fp32_false_true"):
                datatype = "TYPE_FP32"
            elif control.get("bool_false_true"):
                datatype = "TYPE_BOOL"
            else:  # CONTROL_SEQUENCE_CORRID names its type
                datatype = control.get("data_type") or ""
            info = _find(model, "sequence control", control_input.get("name", ""), datatype,
                         graph.inputs, "inputs")
            debatched = info.dims[1:] if max_batch > 0 else info.dims
            if debatched != [1]:
                raise ValueError(f"unable to load model '{model}', sequence control "
                                 f"'{info.name}' in model has dims {_shape_str(debatched)} "
                                 "but dims [1] is expected")
            added += 1
    return added + len(seq.get("state") or [])


def _config_shape(io: dict) -> list[int]:
    """The shape the model sees: the reshape when there is one, else dims."""
    reshape = io.get("reshape")
    dims = reshape.get("shape", []) if reshape is not None else io.get("dims", [])
    return [int(d) for d in dims]


def _shape_str(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def to_int(text, what: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} must be an integer, got '{text}'") from None


def to_bool(text, what: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{what} must be a boolean (true/false, 1/0), got '{text}'")


def param(config: dict, key: str) -> str | None:
    """A model config `parameters` entry's string value, None when absent."""
    value = (config.get("parameters") or {}).get(key)
    if isinstance(value, dict):
        return str(value.get("string_value", ""))
    return None if value is None else str(value)


def int_param(config: dict, key: str, default: int) -> int:
    value = param(config, key)
    return default if value in (None, "") else to_int(value, f"parameter '{key}'")
