"""The onnxruntime backend: one ORT session per instance (configs: onnx_config.py).

This is the framework part only: the worker gathers a batch into one array per input,
calls `OnnxModel.run`, and splits the outputs. The rules follow Triton's onnxruntime
backend (`src/onnxruntime.cc`: AutoCompleteConfig, ValidateInputs/ValidateOutputs, the
session options and execution accelerators its README documents). Errors a user can fix
in the config are ValueError, worded as Triton words them where it has a wording.

Threads: Triton leaves ORT's default (one intra-op thread per core, per session). Here
the worker runs every instance of a model in one process, and Triton starts two CPU
instances of an ONNX model by default, so without `intra_op_thread_count` a session gets
cores / (instances of its kind in the config) threads instead, so instances that run at
once do not fight over cores. `--backend-config=onnxruntime,enable-global-threadpool=1`
(with `intra_op_thread_count` / `inter_op_thread_count` there) shares one pool in the
process, as Triton does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import numpy as np
import onnxruntime as ort

from shm import datatypes
from shm.cpu_quota import cgroup_cpu_quota, usable_cpus
from shm.errors import ErrorCode, InferError
from workers.batch_io import Reshaper
from workers.instance import FrameworkBackend
from workers.onnx_config import (GraphIO, complete, int_param, model_file, param, to_bool,
                                 to_int, validate)

log = logging.getLogger(__name__)


# optimization.graph.level -> ORT level; anything else (0, absent) enables all (Triton)
_GRAPH_LEVEL = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
# TensorRT accelerator parameters Triton passes on under the same name; the others it
# renames (see _tensorrt_options).
_TRT_SAME_NAME = {
    "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_enable",
    "trt_dla_core", "trt_engine_cache_enable", "trt_engine_cache_path",
    "trt_engine_cache_prefix", "trt_dump_subgraphs", "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache",
    "trt_detailed_build_log", "trt_build_heuristics_enable", "trt_sparsity_enable",
    "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_tactic_sources",
    "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes",
    "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model",
    "trt_ep_context_file_path", "trt_ep_context_embed_mode",
}
_TRT_PRECISION = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable",
                  "INT8": "trt_int8_enable", "FP32": None}


def read_graph(model_path: str, backend_config: dict[str, str] | None = None) -> GraphIO:
    """Inputs and outputs of the ONNX file, from a throwaway CPU session (no graph
    optimization, one thread: only the metadata is wanted)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    _use_threads(options, backend_config or {}, 1, 1)
    session = ort.InferenceSession(model_file(model_path), options,
                                   providers=["CPUExecutionProvider"])
    return GraphIO.of(session)


def auto_complete(config: dict, model_path: str, backend_config: dict[str, str]) -> dict:
    """Triton's onnxruntime-backend auto-complete (see onnx_config.complete): returns a
    new config dict."""
    return complete(config, read_graph(model_path, backend_config), backend_config)


# --- session options and execution providers --------------------------------------

_global_pool = False  # the process uses ORT's global thread pools (set once, for good)


def _use_threads(options: ort.SessionOptions, backend_config: dict, intra: int,
                 inter: int) -> None:
    """Per-session pools of `intra`/`inter` threads (0: ORT's default), or the process's
    global pools when the backend config enables them: ORT then refuses any session
    that asks for its own, so every later session in the process shares them."""
    global _global_pool
    if not _global_pool and to_bool(backend_config.get("enable-global-threadpool", "0"),
                                     "backend config 'enable-global-threadpool'"):
        sizes = [to_int(backend_config.get(k, "0"), f"backend config '{k}'")
                 for k in ("intra_op_thread_count", "inter_op_thread_count")]
        try:
            ort.set_global_thread_pool_sizes(*sizes)
        except Exception as exc:  # pools already made: they are used as they are
            log.warning("onnxruntime global thread pools not resized: %s", exc)
        _global_pool = True
    if _global_pool:
        options.use_per_session_threads = False
        return
    if intra > 0:
        options.intra_op_num_threads = intra
    if inter > 0:
        options.inter_op_num_threads = inter


def default_intra_op_threads(config: dict, kind: str) -> int:
    """Cores this process may use (within its cgroup's CPU quota), shared among the
    config's instances of `kind` (all in one worker process): ORT's own default gives
    every session all of the node's cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    cores = usable_cpus(cores, cgroup_cpu_quota())
    group_kind = "KIND_GPU" if kind == "cuda" else "KIND_CPU"
    instances = sum(max(int(g.get("count") or 1), 1) for g in config.get("instance_group") or []
                    if g.get("kind", "KIND_CPU") == group_kind)
    return max(1, cores // max(instances, 1))


_SPINNING = "session.intra_op.allow_spinning"


def session_options(config: dict, backend_config: dict[str, str],
                    kind: str = "cpu") -> tuple[ort.SessionOptions, ort.RunOptions]:
    """Session and run options from the config, under the names Triton's backend reads."""
    options = ort.SessionOptions()
    level = ((config.get("optimization") or {}).get("graph") or {}).get("level", 0)
    options.graph_optimization_level = _GRAPH_LEVEL.get(
        to_int(level, "optimization.graph.level"), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    mode = int_param(config, "execution_mode", 0)
    if mode not in (0, 1):
        raise ValueError("Invalid configuration value provided. Expected values for "
                         f"execution_mode are 0 or 1 but got {mode}.")
    options.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if mode == 0
                              else ort.ExecutionMode.ORT_PARALLEL)
    intra = int_param(config, "intra_op_thread_count", 0) \
        or default_intra_op_threads(config, kind)
    _use_threads(options, backend_config, intra, int_param(config, "inter_op_thread_count", 0))
    # onnxruntime's own session settings pass through by their names, e.g.
    # "session.intra_op.allow_spinning": "0" so idle intra-op threads sleep instead of
    # spinning on cores the frontends and the scheduler need
    for key in (config.get("parameters") or {}):
        if key.startswith("session."):
            options.add_session_config_entry(key, param(config, key))
    if param(config, _SPINNING) is None:
        # Not spinning is our default, unlike onnxruntime's: in a server the cores are
        # shared with the frontends, the scheduler and other instances, and spinning
        # threads take them. MLP over gRPC at c=16 on 2 cores: 147-157 infer/s without
        # spinning against 85-129 with it (scripts/bench_mlp conditions).
        options.add_session_config_entry(_SPINNING, "0")
    if (value := param(config, "enable_mem_arena")) is not None:
        options.enable_cpu_mem_arena = to_bool(value, "parameter 'enable_mem_arena'")
    if (value := param(config, "enable_mem_pattern")) is not None:
        options.enable_mem_pattern = to_bool(value, "parameter 'enable_mem_pattern'")
    run_options = ort.RunOptions()
    key = "memory.enable_memory_arena_shrinkage"
    if (value := param(config, key)) is not None:
        run_options.add_run_config_entry(key, value)
    return options, run_options


@functools.cache
def preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the nvidia-* wheels before the CUDA provider needs them.

    onnxruntime-gpu links them by soname but pip puts them in site-packages, where the
    dynamic loader does not look; a process that imported torch first has them already.
    Once per process; a build without `preload_dlls` (older, or CPU) is left alone."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload(msvc=False)
        except Exception as exc:  # the provider's own load error will say more
            log.warning("onnxruntime could not preload the CUDA libraries: %s", exc)


def execution_providers(config: dict, kind: str, device_id: int = 0,
                        stream_ptr: int | None = None) -> list[tuple[str, dict[str, str]]]:
    """(provider, options) in priority order: TensorRT, CUDA, OpenVINO, CPU.

    An accelerator this onnxruntime build lacks is left out with a warning; a name
    Triton does not know is an error, as in Triton."""
    available = set(ort.get_available_providers())
    accelerators = (config.get("optimization") or {}).get("execution_accelerators") or {}
    chosen = []
    if kind == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise RuntimeError("onnxruntime has no CUDA execution provider; install the gpu "
                               "extra (onnxruntime-gpu) to run KIND_GPU instances")
        preload_cuda_libraries()
        cuda = {"device_id": str(device_id), **_legacy_cuda_options(config)}
        for accelerator in accelerators.get("gpu_execution_accelerator") or []:
            name = accelerator.get("name", "")
            params = {k: str(v) for k, v in (accelerator.get("parameters") or {}).items()}
            if name == "tensorrt":
                if "TensorrtExecutionProvider" in available:
                    chosen.append(("TensorrtExecutionProvider",
                                   _tensorrt_options(params, device_id, stream_ptr)))
                else:
                    log.warning("model '%s' asks for the tensorrt accelerator, which this "
                                "onnxruntime lacks: running on CUDA only", config.get("name"))
            elif name == "cuda":
                for key in ("do_copy_in_default_stream", "use_ep_level_unified_stream"):
                    if key in params:
                        to_bool(params[key], f"cuda accelerator parameter '{key}'")
                cuda.update(params)
            else:
                raise ValueError(f"unknown Execution Accelerator '{name}' is requested")
        if stream_ptr:  # ORT takes 0 for "no stream"
            cuda["user_compute_stream"] = str(stream_ptr)
            cuda["has_user_compute_stream"] = "1"
        chosen.append(("CUDAExecutionProvider", cuda))
    for accelerator in accelerators.get("cpu_execution_accelerator") or []:
        name = accelerator.get("name", "")
        if name != "openvino":
            raise ValueError(f"unknown Execution Accelerator '{name}' is requested")
        if "OpenVINOExecutionProvider" in available:
            chosen.append(("OpenVINOExecutionProvider", {"device_type": "CPU"}))
        else:
            log.warning("model '%s' asks for the openvino accelerator, which this "
                        "onnxruntime lacks: running on the default CPU provider",
                        config.get("name"))
    chosen.append(("CPUExecutionProvider", {}))
    return chosen


def _legacy_cuda_options(config: dict) -> dict[str, str]:
    """CUDA options Triton still reads from `parameters` (deprecated there)."""
    options = {}
    choices = {"cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
               "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested")}
    for key, names in choices.items():
        if param(config, key) is not None:
            index = int_param(config, key, 0)
            if not 0 <= index < len(names):
                raise ValueError(f"unsupported {key} value '{index}' is requested")
            options[key] = names[index]
    for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
        if (value := param(config, key)) is not None:
            options[key] = value
    return options


def _tensorrt_options(params: dict[str, str], device_id: int,
                      stream_ptr: int | None) -> dict[str, str]:
    options = {"device_id": str(device_id)}
    for key, value in params.items():
        if key == "precision_mode":
            if value not in _TRT_PRECISION:
                raise ValueError(f"unsupported precision mode '{value}' is requested")
            if _TRT_PRECISION[value]:
                options[_TRT_PRECISION[value]] = "1"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = str(to_int(value, key))
        elif key in ("int8_calibration_table_name", "int8_use_native_calibration_table"):
            options["trt_" + key] = value
        elif key in _TRT_SAME_NAME:
            options[key] = value
        else:
            raise ValueError(f"unknown parameter '{key}' is provided for TensorRT "
                             "Execution Accelerator")
    if stream_ptr:
        options["user_compute_stream"] = str(stream_ptr)
        options["has_user_compute_stream"] = "1"
    return options


def parse_device(device: str) -> tuple[str, int]:
    """"cpu" -> ("cpu", 0); "cuda:N" (or "gpu:N") -> ("cuda", N)."""
    kind, _, index = device.strip().lower().partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind in ("cuda", "gpu") and (not index or index.isdigit()):
        return "cuda", int(index or 0)
    raise ValueError(f"unknown device '{device}' (expected 'cpu' or 'cuda:N')")


# --- instances ---------------------------------------------------------------------


class OnnxModel:
    """One instance of an ONNX model: an ORT session on the CPU or on one GPU.

    `run` takes whole batches (batch dimension included when max_batch_size > 0) and
    is called by one thread at a time per instance; ORT releases the GIL while it runs.
    A config `reshape` is applied here: inputs are viewed in the model's shape and
    outputs in the config's, so callers deal in config shapes only.
    """

    def __init__(self, config: dict, model_path: str, device: str,
                 backend_config: dict[str, str], stream_ptr: int | None = None):
        self.config = config
        self.name = config.get("name", "")
        self.device, self.device_id = parse_device(device)
        self.max_batch_size = int(config.get("max_batch_size") or 0)
        backend_config = backend_config or {}
        path = model_file(model_path)
        self.session_options, self.run_options = session_options(
            config, backend_config, self.device)
        self.providers = execution_providers(config, self.device, self.device_id, stream_ptr)
        self._cupy = _import_cupy() if self.device == "cuda" else None
        self.session = ort.InferenceSession(path, self.session_options,
                                            providers=self.providers)
        if self.device == "cuda" and "CUDAExecutionProvider" not in self.session.get_providers():
            # ORT falls back to the CPU when the CUDA provider fails to load
            raise RuntimeError(f"onnxruntime could not start its CUDA execution provider on "
                               f"cuda:{self.device_id} for model '{self.name}' (check the "
                               "CUDA and cuDNN libraries onnxruntime-gpu needs)")
        self.graph = GraphIO.of(self.session)
        validate(config, self.graph)
        self._check_supported()
        self.input_names = [io["name"] for io in config.get("input") or []] \
            or list(self.graph.inputs)
        self.output_names = [io["name"] for io in config.get("output") or []] \
            or list(self.graph.outputs)
        self._datatype = {n: t.datatype for tensors in (self.graph.overridable,
                          self.graph.inputs, self.graph.outputs) for n, t in tensors.items()}
        # BYTES tensors: a GPU run that has one goes through session.run (_run_cuda)
        self._strings = frozenset(n for n, t in self._datatype.items() if t == "BYTES")
        self._reshaper = Reshaper(config)  # shared with the other backends (batch_io)
        self._stream = None
        if self._cupy is not None and stream_ptr:
            self._stream = self._cupy.cuda.ExternalStream(stream_ptr, self.device_id)

    def _check_supported(self) -> None:
        for tensors in (self.graph.inputs, self.graph.outputs):
            for info in tensors.values():
                if info.datatype == "BF16":
                    raise ValueError(f"model '{self.name}': BF16 tensor '{info.name}' is not "
                                     "supported by the onnxruntime backend")

    def run(self, inputs: dict[str, object], output_names: list[str]) -> dict[str, object]:
        """Outputs `output_names` (all config outputs when empty) of one batch."""
        names = list(output_names) if output_names else self.output_names
        if self.session is None:
            raise RuntimeError(f"model '{self.name}' instance is closed")
        for name in names:
            if name not in self.graph.outputs:
                raise ValueError(f"model '{self.name}' has no output named '{name}'")
        if (self._cupy is not None and self._strings.isdisjoint(names)
                and self._strings.isdisjoint(inputs)):
            # ORT's IO binding takes no string tensor, on the host or the device: a run
            # that has one goes through session.run below with host inputs (ORT copies
            # the rest to the device itself), as Triton keeps strings on the CPU
            return self._run_cuda(inputs, names)
        # session.run over numpy beats IO binding on the CPU (measured): ORT reads
        # contiguous arrays of the right type in place and hands back its own buffers.
        feeds = {name: self._host_input(name, value) for name, value in inputs.items()}
        values = self.session.run(names, feeds, self.run_options)
        return {name: self._output(name, value) for name, value in zip(names, values)}

    def close(self) -> None:
        self.session = None

    # -- inputs and outputs ---------------------------------------------------------

    def _datatype_of(self, name: str) -> str:
        try:
            return self._datatype[name]
        except KeyError:
            raise ValueError(f"model '{self.name}' has no tensor named '{name}'") from None

    def _host_input(self, name: str, value) -> np.ndarray:
        datatype = self._datatype_of(name)
        if not isinstance(value, np.ndarray):
            # a device array handed to a CPU instance, or a list: one copy to the host
            value = value.get() if hasattr(value, "__cuda_array_interface__") \
                else np.asarray(value)
        if datatype == "BYTES":
            return self._shape_for_model(name, _to_ort_strings(name, value))
        dtype = datatypes.to_numpy(datatype)
        if value.dtype != dtype:
            value = value.astype(dtype)  # a cast the frontend's checks should make rare
        return self._shape_for_model(name, np.ascontiguousarray(value))

    def _shape_for_model(self, name: str, array):
        return self._reshaper.input(name, array)

    def _output(self, name: str, array):
        if self._datatype[name] == "BYTES":
            array = _from_ort_strings(array)
        return self._reshaper.output(name, array)

    def _run_cuda(self, inputs: dict, names: list[str]) -> dict[str, object]:
        """IO binding: device inputs bound by pointer, outputs left where ORT allocates
        them on the device and handed back as cupy arrays over that memory."""
        cp = self._cupy
        binding = self.session.io_binding()
        kept = []  # arrays bound by pointer must outlive the run
        copied_on_device = False
        # without a stream from the worker, ORT uses its own and cupy its current one
        with cp.cuda.Device(self.device_id), (self._stream or contextlib.nullcontext()):
            for name, value in inputs.items():
                datatype = self._datatype_of(name)
                if not hasattr(value, "__cuda_array_interface__"):
                    binding.bind_cpu_input(name, self._host_input(name, value))
                    continue
                array = cp.asarray(value)  # a view for cupy or any __cuda_array_interface__
                if array.device.id != self.device_id:
                    raise ValueError(f"input '{name}' is on cuda:{array.device.id}, model "
                                     f"'{self.name}' runs on cuda:{self.device_id}")
                dtype = datatypes.to_numpy(datatype)
                if array.dtype != dtype or not array.flags.c_contiguous:
                    array = cp.ascontiguousarray(array, dtype=dtype)
                    copied_on_device = True
                array = self._shape_for_model(name, array)
                kept.append(array)
                binding.bind_input(name, "cuda", self.device_id, dtype.type,
                                   list(array.shape), array.data.ptr)
            if copied_on_device and self._stream is None:
                # those copies ran on cupy's stream, not on ORT's
                cp.cuda.get_current_stream().synchronize()
            for name in names:
                binding.bind_output(name, "cuda", self.device_id)
            # Run synchronizes ORT's stream at the end, so outputs are complete on return.
            self.session.run_with_iobinding(binding, self.run_options)
            values = binding.get_outputs()
            result = {}
            for name, value in zip(names, values):
                result[name] = self._output(name, self._device_array(name, value))
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        del kept
        return result

    def _device_array(self, name: str, value: ort.OrtValue):
        """A cupy array over an output's device memory, no copy. The OrtValue is the
        UnownedMemory's owner, so the array keeps ORT's buffer alive; dropping the last
        view returns it to ORT's allocator (a consumer on another stream must be done
        with it, i.e. synchronized, before letting go)."""
        cp = self._cupy
        dtype = datatypes.to_numpy(self._datatype[name])
        shape = tuple(value.shape())
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return cp.empty(shape, dtype)
        memory = cp.cuda.UnownedMemory(value.data_ptr(), nbytes, value, self.device_id)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(memory, 0))


def _to_ort_strings(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements as str: ORT's Python API passes string tensors as text (it would
    take a bytes object as its repr), so the elements must be UTF-8."""
    flat = np.asarray(array, dtype=object).reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    try:
        out[:] = [x if isinstance(x, str) else bytes(x).decode("utf-8")
                  if isinstance(x, (bytes, bytearray, memoryview)) else str(x) for x in flat]
    except UnicodeDecodeError:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"BYTES input '{name}' holds bytes that are not UTF-8; onnxruntime "
                         "passes string tensors as UTF-8 text") from None
    return out.reshape(np.shape(array))


def _from_ort_strings(array: np.ndarray) -> np.ndarray:
    """ORT's str elements back to bytes, as BYTES tensors carry them."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    out[:] = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in flat]
    return out.reshape(array.shape)


def _import_cupy():
    try:
        import cupy
    except ImportError:
        raise RuntimeError("CUDA instances of the onnxruntime backend need cupy; install the "
                           "gpu extra") from None
    return cupy


BACKEND = FrameworkBackend(OnnxModel, auto_complete)
