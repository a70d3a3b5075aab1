"""The pytorch backend: TorchScript models (`model.pt`) run as Triton's libtorch backend
runs them, on the host or on one GPU.

The worker does the batching; this module does the framework part: load the module,
tie config tensors to `forward()` arguments and returned values, and run one batch.
The rules are Triton's (pytorch_backend `model_instance_state.cc` and `model_state.cc`):

Inputs, decided once at load time from `forward`'s schema:
- a `forward` taking one `Dict[str, Tensor]` gets every input in a dict keyed by its
  config name;
- otherwise, when every config input is named like a `forward` argument, inputs go by
  name (FORWARD_ARGUMENT); else when every name is `<name>__<index>`, input `index`
  goes to argument `index` (NAMED_INDEX); else inputs go in config order
  (STRICT_CONFIG_ORDERING). Sequence controls and states must be `<name>__<index>`.
  A mapping that leaves an argument unfed or feeds one twice is a load error here
  (Triton would fail at run time).
Outputs: all `<name>__<index>` picks element `index` of the returned tuple, else
config order; a single Tensor or List[str] return is output 0. Beyond Triton, a
returned list of tensors counts as a tuple and a returned `Dict[str, Tensor]` maps by
key (Triton refuses both).

Parameters honoured (config `parameters`, Triton's names and defaults):
INFERENCE_MODE (default true: torch.inference_mode, else no_grad),
DISABLE_OPTIMIZED_EXECUTION, DISABLE_CUDNN, ENABLE_JIT_PROFILING, ENABLE_JIT_EXECUTOR,
ENABLE_TENSOR_FUSER (the last three are process-wide and set only when given),
ENABLE_CACHE_CLEANING, ENABLE_WEIGHT_SHARING, INTRA_OP_THREAD_COUNT and
INTER_OP_THREAD_COUNT (process-wide: the first model in the process that sets one wins,
as in Triton; `--backend-config=pytorch,intra-op-thread-count=N` and
`inter-op-thread-count=N` give a default, a shmserve addition). ENABLE_NVFUSER is
accepted and ignored (gone from PyTorch). Unlike Triton, the module is put in eval()
mode after loading.

Tensors are not copied on the way in: host inputs become tensors over the same memory
(read-only shared memory included), so a model must not write its inputs. On a GPU
instance, device inputs are taken over dlpack and outputs handed back as cupy arrays
on the device, after the instance's stream is synchronized.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings

import numpy as np
import torch

from shm import datatypes
from shm.errors import ErrorCode, InferError
from workers.batch_io import Reshaper
from workers.instance import FrameworkBackend

log = logging.getLogger("shmserve.pytorch")

# torch.from_numpy warns (once per process) on read-only arrays, which every input
# over read-only shared memory is; inputs are never written (see the module docstring),
# so the warning says nothing here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        category=UserWarning)
# TorchScript is the format this backend serves (Triton's), deprecated in torch or not.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated",
                        category=DeprecationWarning)

DEFAULT_MODEL_FILENAME = "model.pt"

# protocol datatype -> torch dtype; UINT16/32/64 and BYTES have none in Triton's
# backend (BF16 is an addition: it arrives as uint16 words and is viewed as bfloat16).
TORCH_DTYPES = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
    "BF16": torch.bfloat16,
}
_DATATYPE_OF = {dtype: name for name, dtype in TORCH_DTYPES.items()}

_SEQUENCE_BOOL_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END",
                           "CONTROL_SEQUENCE_READY")


class TorchModel:
    """One instance of a TorchScript model on "cpu" or "cuda:N".

    `run` takes a batch as {input name: array} (numpy, or on a GPU instance also an
    array with `__dlpack__`/`__cuda_array_interface__` on that device) and returns
    {output name: array}: numpy for host tensors, cupy for device tensors. Returned
    arrays are read-only and may share memory with the inputs (an identity model
    returns its input), so read them before the inputs' memory is released.
    """

    def __init__(self, config: dict, model_path: str, device: str,
                 backend_config: dict[str, str], stream_ptr: int | None = None):
        self.name = config.get("name", "")
        self._reshaper = Reshaper(config)
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", 0)
        params = _Parameters(config.get("parameters") or {}, self.name)
        self._inference_mode = params.flag("INFERENCE_MODE", True)
        self._optimized = not params.flag("DISABLE_OPTIMIZED_EXECUTION", False)
        self._cudnn = not params.flag("DISABLE_CUDNN", False)
        self._cache_cleaning = params.flag("ENABLE_CACHE_CLEANING", False)
        # JIT switches are process-wide; Triton changes them only when a model says so.
        self._jit_switches = [(setter, value) for setter, value in (
            (torch._C._jit_set_profiling_mode, params.flag("ENABLE_JIT_PROFILING")),
            (torch._C._jit_set_profiling_executor, params.flag("ENABLE_JIT_EXECUTOR")),
            (torch._C._jit_set_texpr_fuser_enabled, params.flag("ENABLE_TENSOR_FUSER")),
        ) if value is not None]
        _set_thread_counts(
            params.integer("INTRA_OP_THREAD_COUNT", backend_config.get("intra-op-thread-count")),
            params.integer("INTER_OP_THREAD_COUNT", backend_config.get("inter-op-thread-count")))

        self._stream = None
        self._cupy = None
        if self._cuda:
            if not torch.cuda.is_available():
                raise ValueError(f"model '{self.name}' asks for {device}, but this torch "
                                 "build or machine has no CUDA device")
            try:
                import cupy  # device outputs are handed over as cupy arrays
            except ImportError as e:
                raise ValueError("the pytorch backend needs cupy on GPU instances") from e
            self._cupy = cupy
            self._stream = (torch.cuda.ExternalStream(stream_ptr, device=self.device)
                            if stream_ptr else torch.cuda.current_stream(self.device))

        self._shared_key = None
        if params.flag("ENABLE_WEIGHT_SHARING", False):
            self._shared_key = (os.path.realpath(model_path), str(self.device))
        self.module = _load(model_path, self.device, self.name, self._inference_mode,
                            self._shared_key)
        self._forward = self.module.forward
        try:
            self._bind_inputs(config)
            self._bind_outputs(config)
        except BaseException:
            self.close()
            raise
        log.debug("model '%s' on %s: inference mode %s, optimized execution %s",
                  self.name, self.device, self._inference_mode, self._optimized)

    # --- load-time binding ------------------------------------------------------

    def _bind_inputs(self, config: dict) -> None:
        arguments = list(self.module.forward.schema.arguments)
        if arguments and arguments[0].type.kind() == "ClassType":
            arguments = arguments[1:]  # self
        feeds = _model_inputs(config, self.name)  # (name, datatype, kind)
        if not any(kind == "input" for _, _, kind in feeds):
            raise ValueError("model configuration must contain at least one input, "
                             "none were specified.")
        batching = config.get("max_batch_size", 0) > 0
        for io in config.get("input", []):
            _check_datatype(io, "input", self.name, batching)

        self._dict_input = (len(arguments) == 1 and arguments[0].type.kind() == "DictType")
        if self._dict_input:
            key, value = arguments[0].type.getKeyType(), arguments[0].type.getValueType()
            if key.kind() != "StringType" or value.kind() != "TensorType":
                raise ValueError(
                    f"An input of type '{arguments[0].type}' was detected in the model. "
                    "Only a single input of type Dict(str, Tensor) or input(s) of type "
                    "Tensor are supported.")
            self._feeds = dict.fromkeys(name for name, _, _ in feeds)  # the dict's keys
            self._arity = 0
        else:
            if any(a.type.kind() == "DictType" for a in arguments[1:]):
                raise ValueError("Multiple inputs of kind DictType were detected. Only a "
                                 "single input of type Dict(str, Tensor) is supported.")
            for a in arguments:
                if a.type.kind() not in ("TensorType", "ListType"):
                    raise ValueError(
                        f"An input of type '{a.type}' was detected in the model. Only a "
                        "single input of type Dict(str, Tensor) or input(s) of type "
                        "Tensor are supported.")
            if len(arguments) != len(feeds):
                raise ValueError(
                    f"unable to load model '{self.name}', configuration expects "
                    f"{len(feeds)} inputs, model provides {len(arguments)}")
            self._feeds = _argument_positions(feeds, [a.name for a in arguments],
                                              self.name)
            self._arity = len(arguments)
        self.input_names = [name for name, _, _ in feeds]
        self._bf16_inputs = {name for name, datatype, _ in feeds if datatype == "BF16"}
        self._string_inputs = {name for name, datatype, _ in feeds if datatype == "BYTES"}

    def _bind_outputs(self, config: dict) -> None:
        outputs = config.get("output", [])
        if not outputs:
            raise ValueError("model configuration must contain at least one output, "
                             "none were specified.")
        batching = config.get("max_batch_size", 0) > 0
        names = [io["name"] for io in outputs]
        indices = [_named_index(name) for name in names]
        if any(i is None for i in indices):
            if _looks_named_index(names):
                log.warning("output(s) of the model '%s' do not follow the "
                            "<name>__<index> naming convention. Falling back to enforcing "
                            "strict ordering from model configuration.", self.name)
            indices = list(range(len(names)))
        self._outputs: dict[str, tuple[int, str]] = {}  # name -> (index, datatype)
        for io, index in zip(outputs, indices):
            self._outputs[io["name"]] = (index, _check_datatype(io, "output", self.name,
                                                                batching))
        states = (config.get("sequence_batching") or {}).get("state", [])
        if states and any(_named_index(name) is None for name in names):
            raise ValueError(
                f"PyTorch model '{self.name}' is using sequence batching with state but "
                "not all inputs and outputs follow the <name>__<index> naming convention. ")
        for state in states:
            name = state["output_name"]
            index = _named_index(name)
            if index is None:
                raise ValueError(
                    f"PyTorch model '{self.name}' is using sequence batching with state "
                    f"but state '{name}' does not follow the <name>__<index> naming "
                    "convention. ")
            self._outputs[name] = (index, datatypes.from_config(state["data_type"]))
        self.output_names = list(self._outputs)

    # --- execution --------------------------------------------------------------

    def run(self, inputs: dict[str, object], output_names: list[str]) -> dict[str, object]:
        """Run one batch; returns the requested outputs (see the class docstring)."""
        for name in inputs:
            if name not in self._feeds:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"unexpected inference input '{name}' for model '{self.name}'")
        for name in output_names:
            if name not in self._outputs:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"unexpected inference output '{name}' for model '{self.name}'")
        for setter, value in self._jit_switches:
            setter(value)
        if self._cuda:
            torch.backends.cudnn.enabled = self._cudnn
            place = contextlib.ExitStack()
            place.enter_context(torch.cuda.device(self.device))
            place.enter_context(torch.cuda.stream(self._stream))
        else:
            place = contextlib.nullcontext()
        with place:
            try:
                with torch.jit.optimized_execution(self._optimized), \
                        torch.inference_mode(self._inference_mode), torch.no_grad():
                    args = self._arguments(inputs)
                    try:
                        result = self._forward(*args)
                    except Exception as e:
                        raise InferError(ErrorCode.INTERNAL,
                                         f"PyTorch execute failure: {e}") from e
                    values = self._output_values(result)
                    outputs = {name: self._output_array(name, values[name])
                               for name in output_names}
            finally:
                if self._cuda:
                    # Work queued on the stream (input copies from host memory the
                    # caller owns, outputs the caller may read on any stream or copy
                    # to the host straight away) is done when this call returns.
                    self._stream.synchronize()
            if self._cuda:
                # inside the stream context: when cupy names the same stream, torch
                # records no cross-stream event for the hand-over
                outputs = {name: self._cupy.from_dlpack(t) if isinstance(t, torch.Tensor)
                           else t for name, t in outputs.items()}
                if self._cache_cleaning:
                    torch.cuda.empty_cache()
        return outputs

    def _arguments(self, inputs: dict[str, object]) -> list:
        if self._dict_input:
            return [{name: self._input_value(name, inputs) for name in self._feeds}]
        args = [None] * self._arity
        for name, position in self._feeds.items():
            args[position] = self._input_value(name, inputs)
        return args

    def _input_value(self, name: str, inputs: dict[str, object]):
        try:
            array = inputs[name]
        except KeyError:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"input '{name}' is missing for model '{self.name}'") from None
        if name in self._string_inputs:
            return _string_list(name, array)
        array = self._reshaper.input(name, array)  # the config's reshape, as Triton's core
        if isinstance(array, torch.Tensor):
            tensor = array
        elif isinstance(array, np.ndarray):
            tensor = _host_tensor(array)
        elif hasattr(array, "__dlpack__"):
            tensor = torch.from_dlpack(array)  # device memory, no copy
        elif hasattr(array, "__cuda_array_interface__"):
            tensor = torch.as_tensor(array, device=self.device)
        else:
            tensor = _host_tensor(np.asarray(array))
        if name in self._bf16_inputs and tensor.dtype in (torch.uint16, torch.int16):
            tensor = tensor.view(torch.bfloat16)  # BF16 travels as raw 16-bit words
        if tensor.device != self.device:
            # host -> device copy on this instance's stream (pinned arenas make it DMA)
            tensor = tensor.to(self.device, non_blocking=True)
        return tensor

    def _output_values(self, result) -> dict[str, object]:
        """Every configured output's value, checked as Triton checks them."""
        if isinstance(result, dict):
            values = {}
            for name in self._outputs:
                if name not in result:
                    raise InferError(
                        ErrorCode.INVALID_ARG,
                        f"output '{name}' is not among the keys the model returned: "
                        f"{sorted(result)}")
                values[name] = result[name]
            return values
        if isinstance(result, torch.Tensor) or _is_string_list(result):
            items = [result]
        elif isinstance(result, (tuple, list)):
            items = list(result)
        else:
            raise InferError(
                ErrorCode.INTERNAL,
                "PyTorch execute failure: output must be of type Tensor, List[str] or "
                "Tuple containing one of these two types. It should not be a List / "
                "Dictionary of Tensors or a Scalar")
        values = {}
        for name, (index, _) in self._outputs.items():
            if index >= len(items):
                raise InferError(
                    ErrorCode.INVALID_ARG,
                    f"The output {name} in the model configuration refers to an output "
                    f"index which doesn't exist. This model has {len(items)} outputs")
            values[name] = items[index]
        return values

    def _output_array(self, name: str, value):
        _, datatype = self._outputs[name]
        if datatype == "BYTES":
            if not _is_string_list(value):
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"output '{name}' must be of type Tensor or List[str].")
            array = np.empty(len(value), dtype=object)
            array[:] = [s.encode("utf-8") for s in value]
            return array
        if not isinstance(value, torch.Tensor):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"output '{name}' must be of type Tensor or List[str].")
        provided = _DATATYPE_OF.get(value.dtype)
        if provided != datatype:
            given = f"TYPE_{provided}" if provided else str(value.dtype)
            raise InferError(
                ErrorCode.INVALID_ARG,
                f"configuration expects datatype {datatypes.to_config(datatype)} for "
                f"output '{name}', model provides {given}")
        if value.dim() == 0:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"output '{name}' is a scalar which is not supported.")
        tensor = value.detach().contiguous()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.uint16)  # BF16 travels as raw 16-bit words
        if tensor.device.type != "cpu":
            # handed over as cupy after the stream is synchronized
            return self._reshaper.output(name, tensor)
        array = tensor.numpy()
        array.flags.writeable = False  # it may be an input's memory or a weight
        return self._reshaper.output(name, array)

    def close(self) -> None:
        """Drop the module (and the device cache, as Triton does on unload)."""
        if getattr(self, "module", None) is None:
            return
        self.module = self._forward = None
        if self._shared_key is not None:
            _release_shared(self._shared_key)
        if self._cuda:
            torch.cuda.empty_cache()


# --- config helpers -----------------------------------------------------------------


class _Parameters:
    """The string parameters of a config, parsed the way Triton's backends parse them."""

    def __init__(self, parameters: dict, model: str):
        self._values = {key: (value.get("string_value", "") if isinstance(value, dict)
                              else str(value))
                        for key, value in parameters.items()}
        self._model = model

    def flag(self, key: str, default: bool | None = None) -> bool | None:
        if key not in self._values:
            return default
        value = self._values[key].strip().lower()
        if value in ("true", "on", "1"):
            return True
        if value in ("false", "off", "0"):
            return False
        raise ValueError(f"failed to convert '{self._values[key]}' to boolean value "
                         f"(parameter '{key}' of model '{self._model}')")

    def integer(self, key: str, default: str | None = None) -> int | None:
        value = self._values.get(key, default)
        if value is None:
            return None
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(f"failed to convert '{value}' to integer value "
                             f"(parameter '{key}' of model '{self._model}')") from None


def _named_index(name: str) -> int | None:
    """The index of a `<name>__<index>` name, else None (Triton splits at the first "__")."""
    position = name.find("__")
    if position < 0:
        return None
    index = name[position + 2:]
    return int(index) if index.isascii() and index.isdigit() else None


def _looks_named_index(names: list[str]) -> bool:
    """Whether the first name that breaks <name>__<index> has a "__" at all: Triton
    warns about a fallback to config order only then (`GetNamingConvention`)."""
    for name in names:
        if _named_index(name) is None:
            return "__" in name
    return False


def _model_inputs(config: dict, model: str) -> list[tuple[str, str, str]]:
    """Every tensor `forward` receives, in Triton's order: config inputs, sequence
    controls, sequence states, batch inputs; as (name, datatype, kind)."""
    feeds = [(io["name"], datatypes.from_config(io["data_type"]), "input")
             for io in config.get("input", [])]
    sequence = config.get("sequence_batching") or {}
    for control_input in sequence.get("control_input", []):
        name = control_input["name"]
        if _named_index(name) is None:
            raise ValueError(f"input '{name}' does not follow <name>__<index> naming "
                             "convention.")
        for control in control_input.get("control", []):
            datatype = _control_datatype(control)
            if datatype not in TORCH_DTYPES:
                raise ValueError(f"input '{name}' type '{datatypes.to_config(datatype)}' "
                                 "is not supported by PyTorch.")
            feeds.append((name, datatype, "control"))
            break
    for state in sequence.get("state", []):
        name = state["input_name"]
        if _named_index(name) is None:
            raise ValueError(
                f"PyTorch model '{model}' is using sequence batching with state but state "
                f"'{name}' does not follow the <name>__<index> naming convention. ")
        datatype = datatypes.from_config(state["data_type"])
        if datatype not in TORCH_DTYPES and datatype != "BYTES":
            raise ValueError(f"unsupported datatype {state['data_type']} for input state "
                             f"'{name}' for model '{model}'")
        feeds.append((name, datatype, "state"))
    for batch_input in config.get("batch_input", []):
        datatype = datatypes.from_config(batch_input["data_type"])
        for name in batch_input.get("target_name", []):
            feeds.append((name, datatype, "batch_input"))
    return feeds


def _control_datatype(control: dict) -> str:
    if control.get("kind") in _SEQUENCE_BOOL_CONTROLS:
        if control.get("fp32_false_true"):
            return "FP32"
        if control.get("bool_false_true"):
            return "BOOL"
        return "INT32"
    return datatypes.from_config(control.get("data_type", "TYPE_INVALID"))


def _argument_positions(feeds, arguments: list[str], model: str) -> dict[str, int]:
    """{input name: forward() position} by Triton's naming conventions."""
    names = [name for name, _, kind in feeds if kind == "input"]
    if all(name in arguments for name in names):
        convention = "FORWARD_ARGUMENT"
    elif all(_named_index(name) is not None for name in names):
        convention = "NAMED_INDEX"
    else:
        convention = "STRICT_CONFIG_ORDERING"
        if _looks_named_index(names):
            log.warning("input(s) of the model '%s' are neither input arguments of its "
                        "forward() nor do they follow the <name>__<index> naming "
                        "convention. Falling back to enforcing strict ordering from "
                        "model configuration.", model)
    if convention != "NAMED_INDEX" and any(kind == "state" for _, _, kind in feeds):
        raise ValueError(
            f"PyTorch model '{model}' is using sequence batching with state but not all "
            "inputs and outputs follow the <name>__<index> naming convention. ")
    positions: dict[str, int] = {}
    for order, (name, _, kind) in enumerate(feeds):
        if kind == "input" and convention == "FORWARD_ARGUMENT":
            positions[name] = arguments.index(name)
        elif kind == "input" and convention == "STRICT_CONFIG_ORDERING":
            positions[name] = order
        elif kind == "batch_input" and convention != "NAMED_INDEX":
            positions[name] = arguments.index(name) if name in arguments else order
        else:
            index = _named_index(name)
            if index is None:
                raise ValueError(f"input '{name}' of model '{model}' does not follow the "
                                 "<name>__<index> naming convention its other inputs use")
            positions[name] = index
    fed = sorted(positions.values())
    if fed != list(range(len(arguments))):
        by_position = ", ".join(f"{name} -> {position}"
                                for name, position in positions.items())
        raise ValueError(
            f"inputs of model '{model}' do not feed each of the {len(arguments)} "
            f"forward() argument(s) ({', '.join(arguments)}) exactly once under the "
            f"{convention} naming convention: {by_position}")
    return positions


def _check_datatype(io: dict, kind: str, model: str, batching: bool) -> str:
    """The tensor's protocol datatype, if Triton's pytorch backend can carry it."""
    config_type = io.get("data_type", "TYPE_INVALID")
    datatype = datatypes.from_config(config_type)
    if datatype == "BYTES":
        reshape = io.get("reshape")
        dims = reshape.get("shape", []) if reshape else io.get("dims", [])
        if len(dims) + (1 if batching else 0) > 1:
            raise ValueError(f"Triton only supports 1 dimensional List of String as "
                             f"{kind} for '{io['name']}' for model '{model}'")
    elif datatype not in TORCH_DTYPES:
        raise ValueError(f"unsupported datatype {config_type} for {kind} "
                         f"'{io['name']}' for model '{model}'")
    return datatype


# --- tensors ----------------------------------------------------------------------


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over a numpy array's memory (no copy unless numpy's layout forbids)."""
    if not array.dtype.isnative or any(s < 0 for s in array.strides):
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))  # copy
    if not array.flags.writeable:
        try:
            # numpy >= 2.1 exports read-only arrays over dlpack: no copy, no warning
            return torch.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError):
            pass
    return torch.from_numpy(array)


def _string_list(name: str, array) -> list[str]:
    """A BYTES input as the List[str] TorchScript models take (Triton's convention)."""
    items = np.asarray(array, dtype=object).reshape(-1)
    try:
        return [item.decode("utf-8") if isinstance(item, (bytes, bytearray))
                else str(item) for item in items]
    except UnicodeDecodeError as e:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"input '{name}' holds bytes that are not UTF-8: {e}") from None


def _is_string_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# --- process-wide state -----------------------------------------------------------

_lock = threading.Lock()
_threads_set = {"intra": False, "inter": False}
_shared: dict[tuple[str, str], list] = {}  # (path, device) -> [module, users]


def _set_thread_counts(intra: int | None, inter: int | None) -> None:
    """torch's thread pools are per process: the first model that sizes one wins."""
    with _lock:
        if intra is not None and intra > 0 and not _threads_set["intra"]:
            torch.set_num_threads(intra)
            _threads_set["intra"] = True
            log.info("intra op thread count is set to %d", torch.get_num_threads())
        if inter is not None and inter > 0 and not _threads_set["inter"]:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError as e:  # too late: inter-op work has already started
                log.warning("inter op thread count stays %d: %s",
                            torch.get_num_interop_threads(), e)
            _threads_set["inter"] = True


def _load(path: str, device: torch.device, model: str, inference_mode: bool,
          shared_key) -> torch.jit.ScriptModule:
    if shared_key is not None:
        with _lock:
            entry = _shared.get(shared_key)
            if entry is not None:
                entry[1] += 1
                return entry[0]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"unable to find '{path}' for model instance '{model}'")
    try:
        # Triton loads under the same inference-mode guard it runs with.
        with torch.inference_mode(inference_mode):
            module = torch.jit.load(path, map_location=device)
    except Exception as e:
        raise ValueError(f"failed to load model '{model}': {e}") from e
    module.eval()
    if shared_key is not None:
        with _lock:
            entry = _shared.setdefault(shared_key, [module, 0])
            entry[1] += 1
            return entry[0]
    return module


def _release_shared(key) -> None:
    with _lock:
        entry = _shared.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _shared[key]


BACKEND = FrameworkBackend(TorchModel)  # TorchScript carries no config to complete
