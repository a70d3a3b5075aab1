"""Model configuration: parse `config.pbtxt`, fill Triton's defaults, validate, print.

The rules follow Triton's core (`model_config_utils.cc`: AutoCompleteBackendFields,
NormalizeModelConfig, NormalizeInstanceGroup, ValidateModelConfig, ValidateIOShape,
ValidateInstanceGroup, ModelConfigToJson). Error reasons reuse Triton's wording where it
has one, so users can search for them. Everything here is pure: the only I/O is
`load_config` reading one file.
"""

from collections.abc import Collection, Sequence
from pathlib import Path

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelSequenceBatching,
)

from shm import datatypes
from shm.backends import BACKENDS, MODEL_FILES, PLATFORM_BACKEND

CONFIG_FILENAME = "config.pbtxt"
ENSEMBLE_PLATFORM = "ensemble"
WILDCARD_DIM = -1
# Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS.
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

_KIND = ModelInstanceGroup.Kind
_CONTROL = ModelSequenceBatching.Control.Kind


class ConfigError(Exception):
    """A model configuration that cannot be read or that Triton would refuse to load."""


def parse_config(text: str, source: str) -> ModelConfig:
    """Parse protobuf text format into a ModelConfig; ConfigError names `source`."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        # str(e) starts with "line:col : "; restate it so the file comes first.
        detail = str(e).split(" : ", 1)[-1]
        raise ConfigError(
            f"failed to parse model configuration {source}: line {e.GetLine()}, "
            f"column {e.GetColumn()}: {detail}") from None
    except ValueError as e:  # text_format's word for an enum number out of int32 range
        raise ConfigError(f"failed to parse model configuration {source}: {e}") from None
    return config


def load_config(model_dir: Path) -> ModelConfig:
    """Read `<model_dir>/config.pbtxt`; an absent file gives a config with only a name.

    The name defaults to the directory name and must equal it when given (Triton: a
    model's directory name must equal its model name).
    """
    model_dir = Path(model_dir)
    path = model_dir / CONFIG_FILENAME
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"failed to read model configuration {path}: {e}") from None
        config = parse_config(text, str(path))
    else:
        # Triton auto-completes a missing config (the default since auto-complete is on).
        config = ModelConfig()
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        raise ConfigError(
            f"unexpected directory name '{model_dir.name}' for model '{config.name}', "
            "directory name must equal model name")
    return config


def model_filename(config: ModelConfig) -> str:
    """The model file a backend loads: `default_model_filename`, else its default.

    Triton leaves `default_model_filename` empty when a config names the platform
    (e.g. `pytorch_libtorch`), and the backend then uses its own default.
    """
    return config.default_model_filename or MODEL_FILES.get(config.backend, "")


# --- normalization ---------------------------------------------------------------


def normalize(config: ModelConfig, *, has_gpu: bool = False,
              gpu_ids: Sequence[int] | None = None,
              model_files: Collection[str] | None = None) -> ModelConfig:
    """A copy of `config` with defaults filled as Triton prints them after loading.

    `gpu_ids` lists the usable GPUs (default `[0]` when `has_gpu`); `model_files` are the
    names inside the model's first version directory, used, as Triton does, to find the
    backend of a config that names neither backend nor platform.
    """
    out = ModelConfig()
    out.CopyFrom(config)
    gpus = (list(gpu_ids) if gpu_ids is not None else [0]) if has_gpu else []
    _complete_backend_fields(out, model_files)
    _normalize_model_config(out)
    _normalize_instance_groups(out, gpus)
    return out


def _complete_backend_fields(config: ModelConfig, files: Collection[str] | None) -> None:
    """Fill backend, platform and default_model_filename (AutoCompleteBackendFields)."""
    if not config.backend:
        config.backend = _infer_backend(config, set(files or ()))
    backend = config.backend
    if backend in ("tensorrt", "onnxruntime"):
        if not config.platform:
            config.platform = BACKENDS[backend].platforms[0]
        if not config.default_model_filename:
            config.default_model_filename = MODEL_FILES[backend]
    elif backend == "pytorch":
        # Triton fills the filename only together with a platform it infers from the
        # backend; a config (or a model file) that gives the platform keeps it empty.
        if not config.platform:
            config.platform = BACKENDS[backend].platforms[0]
            if not config.default_model_filename:
                config.default_model_filename = MODEL_FILES[backend]
    elif backend in ("openvino", "python"):
        if not config.default_model_filename:
            config.default_model_filename = MODEL_FILES[backend]


def _infer_backend(config: ModelConfig, files: set[str]) -> str:
    """The backend a config without one implies, or "" when nothing does."""
    platform, filename = config.platform, config.default_model_filename
    if platform.startswith("tensorflow_"):
        return PLATFORM_BACKEND.get(platform, "")
    for backend, default in MODEL_FILES.items():
        if filename == default or (platform and PLATFORM_BACKEND.get(platform) == backend):
            return backend
    if platform or filename:
        return ""
    for backend, default in MODEL_FILES.items():
        # A bare config is completed from the files in the first version directory.
        if default in files:
            if backend == "pytorch":
                config.platform = BACKENDS[backend].platforms[0]
            return backend
    if "." in config.name:
        # A custom backend named by the model: "model.identity" -> backend "identity".
        custom = config.name.split(".", 1)[1]
        config.default_model_filename = "model." + custom
        return custom
    return ""


def _normalize_model_config(config: ModelConfig) -> None:
    """Version policy, batcher and optimization defaults (NormalizeModelConfig)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size \
                and config.max_batch_size > 0:
            seq.oldest.preferred_batch_size.append(config.max_batch_size)
    # Ensembles get no optimization block: Triton rejects one on an ensemble.
    # Triton adds nothing else here; in particular `model_transaction_policy` appears
    # only when the config (or a backend's auto-complete) sets it.
    if not config.HasField("ensemble_scheduling"):
        opt = config.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True


def _normalize_instance_groups(config: ModelConfig, gpus: list[int]) -> None:
    """Name, kind, count and GPUs of every instance group (NormalizeInstanceGroup)."""
    if config.HasField("ensemble_scheduling"):
        return
    if not config.instance_group:
        # Triton names the group it adds after the model itself, not "<model>_0".
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == _KIND.KIND_AUTO:
            # GPU when there are GPUs and every listed one exists, for every backend:
            # the python backend also prefers KIND_GPU on a GPU machine.
            usable = bool(gpus) and all(g in gpus for g in group.gpus)
            group.kind = _KIND.KIND_GPU if usable else _KIND.KIND_CPU
        if group.count < 1:
            # Triton replaces any count below 1, negative ones included.
            backend = BACKENDS.get(config.backend)
            group.count = backend.cpu_instances if (
                backend and group.kind == _KIND.KIND_CPU) else 1
        if group.kind == _KIND.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


# --- validation ------------------------------------------------------------------


def validate(config: ModelConfig, *, gpu_ids: Sequence[int] | None = None) -> None:
    """Raise ConfigError with Triton's reason if Triton would refuse `config`.

    Expects a normalized config, as Triton validates after normalizing. `gpu_ids`, when
    given, are the usable GPUs that KIND_GPU groups may name.
    """
    name = config.name
    if not name:
        raise ConfigError("model configuration must specify 'name'")
    _validate_platform(config)
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    if not config.HasField("version_policy"):
        raise ConfigError(f"must specify 'version policy' for {name}")
    _validate_io(config)
    _validate_batch_io(config)
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)
    if config.HasField("ensemble_scheduling"):
        _validate_ensemble(config)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise ConfigError(f"ensemble scheduling must be set for ensemble {name} "
                          f"whose platform is {ENSEMBLE_PLATFORM}")
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ConfigError(f"Response Cache does not currently support model {name} with "
                          "'decoupled' transaction policy. Please disable the response cache.")
    if not config.HasField("ensemble_scheduling"):
        _validate_instance_groups(config, gpu_ids)


def _validate_platform(config: ModelConfig) -> None:
    name, platform, backend = config.name, config.platform, config.backend
    if not platform and not backend:
        raise ConfigError(f"must specify 'platform' or 'backend' for '{name}'")
    if not backend and platform != ENSEMBLE_PLATFORM:
        raise ConfigError(f"unexpected platform type '{platform}' for {name}")
    if backend and platform == ENSEMBLE_PLATFORM:
        raise ConfigError(f"Ensemble model '{name}' must have platform type "
                          f"'{platform}' and empty backend type")
    # A known backend must agree with the platform; custom backends allow any platform.
    known = set(PLATFORM_BACKEND.values())
    if backend in known and PLATFORM_BACKEND.get(platform) != backend:
        raise ConfigError(f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}")


def _validate_io(config: ModelConfig) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen = set()
        for io in tensors:
            _validate_tensor(config, kind, io)
            if io.name in seen:
                raise ConfigError(f"model {kind} '{io.name}' is specified more than once "
                                  f"for {config.name}")
            seen.add(io.name)


def _validate_batch_io(config: ModelConfig) -> None:
    """Triton's ValidateBatchIO: kinds with one source input each, batch inputs in
    INT32 or FP32, sources among the inputs, batch outputs among the outputs. Names are
    checked once the config lists inputs (outputs): a config left for auto-complete to
    fill is validated again after it, as Triton validates IO after the backend's
    auto-complete."""
    suffix = f" for {config.name}"
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for batch_input in config.batch_input:
        # every kind model_config.proto has reads exactly one source input
        if batch_input.kind not in type(batch_input).Kind.values():  # proto3 takes any number
            raise ConfigError(f"unknown batch input kind {batch_input.kind}" + suffix)
        kind = type(batch_input).Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise ConfigError(f"batch input kind '{kind}' expects 1 source input, got "
                              f"{len(batch_input.source_input)}" + suffix)
        if batch_input.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise ConfigError("batch input data type must be TYPE_INT32 or TYPE_FP32"
                              + suffix)
        for source in batch_input.source_input:
            if inputs and source not in inputs:
                raise ConfigError(f"unknown source input name '{source}'" + suffix)
        for target in batch_input.target_name:
            if target in inputs:
                raise ConfigError(f"batch input target '{target}' is also a model input"
                                  + suffix)
    for batch_output in config.batch_output:
        if batch_output.kind not in type(batch_output).Kind.values():  # proto3 takes any number
            raise ConfigError(f"unknown batch output kind {batch_output.kind}" + suffix)
        kind = type(batch_output).Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise ConfigError(f"batch output kind '{kind}' expects 1 source input, got "
                              f"{len(batch_output.source_input)}" + suffix)
        for source in batch_output.source_input:
            if inputs and source not in inputs:
                raise ConfigError(f"unknown source input name '{source}'" + suffix)
        targets = set()
        for target in batch_output.target_name:
            if outputs and target not in outputs:
                raise ConfigError(f"unknown target output name '{target}'" + suffix)
            if target in targets:
                raise ConfigError(f"target output name '{target}' can only be specified "
                                  "once" + suffix)
            targets.add(target)


def _validate_tensor(config: ModelConfig, kind: str, io) -> None:
    """One input or output (ValidateIOShape plus the per-kind checks)."""
    name, suffix = config.name, f" for {config.name}"
    if not io.name:
        raise ConfigError(f"model {kind} must specify 'name'{suffix}")
    prefix = f"model {kind} '{io.name}' "
    if io.data_type == DataType.TYPE_INVALID:
        raise ConfigError(prefix + "must specify 'data_type'" + suffix)
    type_name = DataType.Name(io.data_type) if io.data_type in DataType.values() \
        else str(io.data_type)
    if not datatypes.is_known(datatypes.from_config(type_name)):
        raise ConfigError(f"model '{name}': {kind} '{io.name}' has unknown data type "
                          f"{type_name}")
    if not io.dims:
        raise ConfigError(prefix + "must specify 'dims'" + suffix)
    if io.HasField("reshape") and not io.reshape.shape and config.max_batch_size == 0:
        raise ConfigError(prefix + "cannot have empty reshape for non-batching model as "
                          "scalar tensors are not supported" + suffix)
    if any(d < 1 and d != WILDCARD_DIM for d in io.dims):
        raise ConfigError(prefix + "dimension must be integer >= 1, or -1 to indicate a "
                          "variable-size dimension" + suffix)
    if io.HasField("reshape"):
        _validate_reshape(prefix, suffix, list(io.dims), list(io.reshape.shape))
    if isinstance(io, ModelInput) and io.format in (ModelInput.FORMAT_NHWC,
                                                    ModelInput.FORMAT_NCHW) \
            and len(io.dims) != 3:
        raise ConfigError("model input NHWC/NCHW require 3 dims" + suffix)
    if io.is_shape_tensor and config.platform != "tensorrt_plan":
        raise ConfigError("shape tensors are only supported for TensorRT platform" + suffix)


def _validate_reshape(prefix: str, suffix: str, dims: list[int], shape: list[int]) -> None:
    if any(d < 1 and d != WILDCARD_DIM for d in shape):
        raise ConfigError(prefix + "reshape dimensions must be integer >= 1, or -1 to "
                          "indicate a variable-size dimension" + suffix)

    def chunks(values):
        # Element counts of the runs between variable-size dimensions.
        out, count = [], 1
        for d in values:
            if d == WILDCARD_DIM:
                out.append(count)
                count = 1
            else:
                count *= d
        return out + [count]

    dims_chunks, shape_chunks = chunks(dims), chunks(shape)
    if len(dims_chunks) == 1 and not shape:
        # An empty reshape is a scalar: dims must hold exactly one element.
        if dims_chunks[0] != 1:
            raise ConfigError(prefix + "has different size for dims and reshape" + suffix)
        return
    if len(dims_chunks) != len(shape_chunks):
        if len(dims_chunks) == 1 or len(shape_chunks) == 1:
            raise ConfigError(prefix + "has different size for dims and reshape" + suffix)
        raise ConfigError(prefix + "has different number of variable-size dimensions for "
                          "dims and reshape" + suffix)
    if dims_chunks != shape_chunks:
        raise ConfigError(prefix + "has different size for dims and reshape" + suffix)


def _validate_dynamic_batching(config: ModelConfig) -> None:
    # Triton accepts dynamic batching with max_batch_size 0 (batches of one request).
    name, batching = config.name, config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise ConfigError(
                f"default priority level must be in range [1, {levels}] for {name}")
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            raise ConfigError(f"priority queue policy must have priority level in range "
                              f"[1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise ConfigError("Only one priority level is allowed when 'preserve_ordering' "
                              f"is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds and policy.timeout_action == policy.DELAY:
                raise ConfigError("Queue policy can not have DELAY as timeout action when "
                                  f"'preserve_ordering' is true for {name}")


def _validate_sequence_batching(config: ModelConfig) -> None:
    # Triton accepts sequence batching with max_batch_size 0 as well.
    name, seq = config.name, config.sequence_batching
    if config.response_cache.enable:
        raise ConfigError(f"Response Cache does not currently support model {name} with "
                          "sequence batching scheduler. Please disable the response cache.")
    _validate_sequence_controls(name, seq)
    for size in seq.oldest.preferred_batch_size:
        if size <= 0:
            raise ConfigError(
                f"sequence batching preferred batch size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"sequence batching preferred batch size must be <= max batch size for {name}")
    if seq.HasField("direct") and not 0.0 <= seq.direct.minimum_slot_utilization <= 1.0:
        raise ConfigError("sequence batching minimum slot utilization must be in range "
                          f"(0.0, 1.0] for {name}")


_CORRID_TYPES = {DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32,
                 DataType.TYPE_INT32, DataType.TYPE_STRING}


def _validate_sequence_controls(name: str, seq) -> None:
    """Control tensors: named once, each kind once, with well-formed values."""
    seen_tensors, seen_kinds = set(), set()
    for control_input in seq.control_input:
        if not control_input.name:
            raise ConfigError(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise ConfigError(f"sequence batching control tensor '{control_input.name}' is "
                              f"specified for multiple control kinds for {name}")
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind not in _CONTROL.values():
                # proto3 enums take any number; Kind.Name would raise ValueError
                raise ConfigError(f"sequence batching control tensor '{control_input.name}' "
                                  f"has unexpected kind {control.kind} for {name}")
            kind = _CONTROL.Name(control.kind)
            if control.kind in seen_kinds:
                raise ConfigError(
                    f"sequence batching specifies multiple {kind} tensors for {name}")
            seen_kinds.add(control.kind)
            given = [field for field in ("int32_false_true", "fp32_false_true",
                                         "bool_false_true") if getattr(control, field)]
            if control.kind == _CONTROL.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise ConfigError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                if control.data_type not in _CORRID_TYPES:
                    raise ConfigError(
                        f"unexpected data type for control {kind} for {name}. Allowed data "
                        "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and "
                        "TYPE_STRING")
            elif control.kind in (_CONTROL.CONTROL_SEQUENCE_START, _CONTROL.CONTROL_SEQUENCE_END,
                                  _CONTROL.CONTROL_SEQUENCE_READY):
                if not given:
                    raise ConfigError(
                        "sequence batching must specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                if len(given) > 1:
                    raise ConfigError(
                        "sequence batching specifies more than one from 'int32_false_true', "
                        f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}")
                if len(getattr(control, given[0])) != 2:
                    raise ConfigError(f"sequence batching control '{given[0]}' must have "
                                      f"exactly 2 entries for {kind} for {name}")


def _validate_ensemble(config: ModelConfig) -> None:
    """The ensemble's own fields; its step graph is checked by the ensemble scheduler."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(f"ensemble scheduling cannot be set for model '{name}' whose "
                          f"platform is not {ENSEMBLE_PLATFORM}")
    if config.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")
    _validate_ensemble_flow(config)


class _FlowNode:
    """An ensemble tensor in the data-flow graph: the tensors it is computed from."""

    __slots__ = ("produced", "ready", "prev", "next")

    def __init__(self):
        self.produced = False  # some step's output_map names it
        self.ready = False
        self.prev: list[str] = []
        self.next: list[str] = []


def _validate_ensemble_flow(config: ModelConfig) -> None:
    """Every ensemble output is computed from the ensemble inputs, and every tensor is
    used (Triton's BuildEnsembleGraph and ValidateEnsembleSchedulingConfig, with its
    messages). Cycles show up here as outputs that are never written. The step
    models' own inputs, outputs, types and shapes are checked once they are loaded
    (scheduler/scheduling/ensemble.py)."""
    name = config.name
    nodes: dict[str, _FlowNode] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise ConfigError(
                    f"must specify '{field}' in step {index} of ensemble '{name}'")
        produced = []
        for tensor in step.output_map.values():
            node = nodes.setdefault(tensor, _FlowNode())
            if node.produced:
                raise ConfigError(f"ensemble tensor '{tensor}' can appear in an output map "
                                  f"only once for ensemble '{name}' step {index}")
            node.produced = True
            produced.append(tensor)
        # input_map is a map: a model input cannot be listed twice in one step
        for tensor in step.input_map.values():
            node = nodes.setdefault(tensor, _FlowNode())
            for out in produced:
                nodes[out].prev.append(tensor)
                node.next.append(out)
    queue = []
    for io in config.input:
        node = nodes.get(io.name)
        if node is None:
            raise ConfigError(f"ensemble input '{io.name}' for ensemble {name}' is not used")
        node.ready = True
        queue.append(io.name)
    while queue:  # breadth first from the inputs, as Triton walks it
        for tensor in nodes[queue.pop(0)].next:
            node = nodes[tensor]
            if not node.ready and all(nodes[p].ready for p in node.prev):
                node.ready = True
                queue.append(tensor)
    outputs = set()
    for io in config.output:
        node = nodes.get(io.name)
        if node is None:
            raise ConfigError(f"ensemble output '{io.name}' for ensemble {name}' is not used")
        if not node.ready:
            message = f"output '{io.name}' for ensemble '{name}' is not written"
            # follow the first unready tensor back to where the flow breaks
            last, seen, prev = io.name, set(), node.prev
            while prev:
                nxt = None
                for p in prev:
                    if not nodes[p].ready and p not in seen:
                        seen.add(p)
                        last, nxt = p, nodes[p].prev
                        break
                prev = nxt
            if last != io.name:
                message += (f": at least one of its depending tensors, '{last}', is not "
                            "connected")
            raise ConfigError(message)
        outputs.add(io.name)
    for tensor, node in nodes.items():
        if tensor not in outputs and (not node.ready or not node.next):
            raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _validate_instance_groups(config: ModelConfig, gpu_ids: Sequence[int] | None) -> None:
    """Kinds resolved, counts positive, GPUs only where they belong (ValidateInstanceGroup)."""
    name = config.name
    if not config.instance_group:
        raise ConfigError(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.count < 1:
            # Unreachable after normalize (it replaces counts below 1, as Triton does).
            raise ConfigError(f"{where} must have a count of at least 1, got {group.count}")
        if group.kind == _KIND.KIND_AUTO:
            raise ConfigError(f"{where} has unexpected kind KIND_AUTO")
        if group.kind not in _KIND.values():  # a number no kind has (proto3 takes it)
            raise ConfigError(f"{where} has unexpected kind {group.kind}")
        if group.kind in (_KIND.KIND_CPU, _KIND.KIND_MODEL) and group.gpus:
            raise ConfigError(f"{where} has kind {_KIND.Name(group.kind)} but specifies "
                              "one or more GPUs")
        if group.kind == _KIND.KIND_GPU:
            if not group.gpus:
                raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available")
            if gpu_ids is not None:
                for gpu in group.gpus:
                    if gpu not in gpu_ids:
                        # Triton's words, its default minimum compute capability (6.0)
                        # printed as C++ prints a double
                        available = ", ".join(str(g) for g in gpu_ids)
                        raise ConfigError(f"{where} specifies invalid or unsupported gpu id "
                                          f"{gpu}. GPUs with at least the minimum required "
                                          f"CUDA compute compatibility of 6.000000 are: "
                                          f"{available}")
        if group.profile and config.platform != "tensorrt_plan":
            raise ConfigError(f"{where} and platform {config.platform} specifies profile "
                              "field which is only supported for TensorRT models")


# --- JSON ------------------------------------------------------------------------

# protobuf renamed the option that prints fields left at their defaults.
try:
    json_format.MessageToDict(ModelConfig(), always_print_fields_with_no_presence=True)
    _PRINT_DEFAULTS = {"always_print_fields_with_no_presence": True}
except TypeError:  # protobuf < 5.26
    _PRINT_DEFAULTS = {"including_default_value_fields": True}

_INT64_TYPES = {FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64}


def config_to_json(config: ModelConfig) -> dict:
    """The JSON object Triton's `GET /v2/models/{m}/config` returns for `config`.

    Proto field names, every field without presence printed at its default (enum names,
    [] and {} included), unset sub-messages left out, and 64-bit integers as numbers
    rather than protobuf's strings. Map keys stay strings, as JSON requires.
    """
    obj = json_format.MessageToDict(config, preserving_proto_field_name=True, **_PRINT_DEFAULTS)
    _int64_as_numbers(config.DESCRIPTOR, obj)
    return obj


def _is_repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return repeated
    return field.label == FieldDescriptor.LABEL_REPEATED


def _int64_as_numbers(descriptor, obj: dict) -> None:
    """Turn protobuf's string-encoded 64-bit integers in `obj` back into ints, in place."""
    for field in descriptor.fields:
        if field.name not in obj:
            continue
        value = obj[field.name]
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                for key, item in value.items():
                    if value_field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                        _int64_as_numbers(value_field.message_type, item)
                    elif value_field.cpp_type in _INT64_TYPES:
                        value[key] = int(item)
            elif _is_repeated(field):
                for item in value:
                    _int64_as_numbers(entry, item)
            else:
                _int64_as_numbers(entry, value)
        elif field.cpp_type in _INT64_TYPES:
            obj[field.name] = [int(v) for v in value] if _is_repeated(field) else int(value)
