"""Checks a decoded inference request against its model's config, as Triton does.

Shared by the HTTP and gRPC frontends. The order of the checks and the wording of the
errors follow Triton core (`InferenceRequest::Normalize` and the input byte-size checks
that come after it, `Model::GetInput`/`GetOutput`), because users grep logs and tests for
these messages. Every error is InferError(INVALID_ARG) and, like Triton's, starts with
`[request id: <id>] ` (`<id_unknown>` when the request has no id), except an unknown
input or output name, which Triton reports without it. Triton walks a request's inputs
in the order of its hash map, which for a few inputs is the reverse of the request's
order (libstdc++'s `unordered_map`); the checks here walk them the same way so the
input named in an error is the one Triton names (tests/data/triton_errors_2.51.json).

A config's inputs and outputs are read from protobuf once and cached, so a request costs
a few dict lookups and integer comparisons.
"""

from __future__ import annotations

import struct

from shm.datatypes import element_size, from_config
from shm.errors import ErrorCode, InferError

from .types import DecodedRequest

_INVALID = ErrorCode.INVALID_ARG
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
    "dimension to be prepended to each input shape. If you want to specify the full "
    "shape including the batch dim in your input dims config, try setting "
    "max_batch_size to zero. See the model configuration docs for more info on "
    "max_batch_size.")
_LEN = struct.Struct("<I")


class _InputSpec:
    __slots__ = ("datatype", "dims", "optional", "is_shape_tensor")

    def __init__(self, datatype, dims, optional, is_shape_tensor):
        self.datatype = datatype
        self.dims = dims
        self.optional = optional
        self.is_shape_tensor = is_shape_tensor


class _ModelSpec:
    """The parts of a ModelConfig that request validation reads, as plain Python."""

    __slots__ = ("config", "name", "max_batch_size", "inputs", "input_order",
                 "required", "outputs", "corrid")

    def __init__(self, config):
        self.config = config  # keeps id(config) from being reused while cached
        self.name = config.name
        self.max_batch_size = int(config.max_batch_size)
        self.inputs = {
            i.name: _InputSpec(from_config(_dtype_name(i.data_type)), tuple(i.dims),
                               bool(i.optional), bool(i.is_shape_tensor))
            for i in config.input
        }
        self.input_order = [i.name for i in config.input]
        self.required = [i.name for i in config.input if not i.optional]
        self.outputs = {o.name for o in config.output}
        # the CONTROL_SEQUENCE_CORRID input's name and type, for a model that has one
        self.corrid = _corrid_control(config)


def _dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2  # only on a cache miss

    return model_config_pb2.DataType.Name(value)


_SPECS: dict[int, _ModelSpec] = {}


def _spec(config) -> _ModelSpec:
    spec = _SPECS.get(id(config))
    if spec is None or spec.config is not config:
        if len(_SPECS) >= 256:  # configs are replaced on reload; don't grow forever
            _SPECS.clear()
        spec = _SPECS[id(config)] = _ModelSpec(config)
    return spec


def dims_str(dims) -> str:
    """Triton's DimsListToString: '[-1,16]'."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def validate_request(req: DecodedRequest, config) -> int:
    """Check `req` against `config` (a model_config_pb2.ModelConfig).

    Returns the request's batch size: the shared first dimension of its inputs for a
    model with max_batch_size > 0, or 0 for a model that does not batch (Triton's
    `InferenceRequest::BatchSize()`). Raises InferError(INVALID_ARG) with Triton's
    message otherwise. Inputs whose `data` is None live in a client's shared-memory
    region: their `shared_memory_byte_size` stands for the data's size (whether the
    region holds that many bytes is checked by whoever resolves the region).
    """
    spec = _spec(config)
    model = spec.name or req.model_name
    prefix = f"[request id: {req.id or '<id_unknown>'}] "

    if req.outputs:
        for out in req.outputs:
            if out.name not in spec.outputs:
                raise InferError(
                    _INVALID,
                    f"unexpected inference output '{out.name}' for model '{model}'")
            if out.parameters and "shared_memory_region" in out.parameters:
                shm_byte_size(out.name, out.parameters, prefix)

    inputs = req.inputs[::-1]  # Triton's order: see the module's docstring
    given = {}
    for inp in inputs:
        if inp.name in given:
            raise InferError(
                _INVALID, f"{prefix}input '{inp.name}' already exists in request")
        given[inp.name] = inp
    if len(given) > len(spec.input_order) or len(given) < len(spec.required):
        raise _input_count_error(spec, given, model, prefix)

    batch_size = 0
    mbs = spec.max_batch_size
    for inp in inputs:
        ispec = spec.inputs.get(inp.name)
        if ispec is None:
            raise InferError(
                _INVALID, f"unexpected inference input '{inp.name}' for model '{model}'")
        if mbs > 0 and not ispec.is_shape_tensor:
            if not inp.shape:
                raise InferError(
                    _INVALID,
                    f"{prefix}input '{inp.name}' has no shape but model requires batch "
                    f"dimension for '{model}'")
            if batch_size == 0:
                batch_size = inp.shape[0]
            elif inp.shape[0] != batch_size:
                raise InferError(
                    _INVALID,
                    f"{prefix}input '{inp.name}' batch size does not match other "
                    f"inputs for '{model}'")
    if len(given) < len(spec.input_order) and any(
            n not in given for n in spec.required):  # an optional one stood in
        raise _input_count_error(spec, given, model, prefix)
    if batch_size > mbs:
        raise InferError(
            _INVALID,
            f"{prefix}inference request batch-size must be <= {mbs} for '{model}'")

    for inp in inputs:
        ispec = spec.inputs[inp.name]
        if inp.datatype != ispec.datatype:
            raise InferError(
                _INVALID,
                f"{prefix}inference input '{inp.name}' data-type is '{inp.datatype}', "
                f"but model '{model}' expects '{ispec.datatype}'")
        shape = inp.shape
        dims = shape[1:] if (mbs > 0 and not ispec.is_shape_tensor) else shape
        match = len(dims) == len(ispec.dims)
        if match:
            for c, d in zip(ispec.dims, dims):
                if c != d and c != -1:
                    match = False
                    break
                if d < 0:
                    raise InferError(
                        _INVALID,
                        f"{prefix}All input dimensions should be specified for input "
                        f"'{inp.name}' for model '{model}', got {dims_str(shape)}")
        if not match:
            full = ((-1,) + ispec.dims) if mbs > 0 else ispec.dims
            raise InferError(
                _INVALID,
                f"{prefix}unexpected shape for input '{inp.name}' for model '{model}'. "
                f"Expected {dims_str(full)}, got {dims_str(shape)}. "
                + (_BATCH_NOTE if mbs > 0 else ""))

    # Triton 2.51 sizes a batch of 0 as a batch of 1 ("Expected 16, got 0" for [0,4])
    skip = 1 if (mbs > 0 and batch_size == 0) else 0
    for inp in inputs:
        ispec = spec.inputs[inp.name]
        lead = skip if not ispec.is_shape_tensor else 0
        if inp.data is not None:
            check_input_byte_size(inp, model, prefix, lead)
        else:
            check_shm_input(inp, model, prefix)
    if skip:
        # Triton 2.51 runs [0,4] carrying 16 bytes; the bytes contradict the shape and
        # a batch of nothing cannot be scheduled: refused (tests/e2e/test_error_table.py)
        raise InferError(
            _INVALID, f"{prefix}inference request batch-size must be >= 1 for '{model}'")
    if spec.corrid is not None:
        _check_corrid_type(req, spec.corrid, model, prefix)
    return batch_size


# Triton's InferenceRequest::ValidateCorrelationId: a string id needs a STRING CORRID,
# a number (the default 0 included) one of the integer types
_CORRID_INTS = ("UINT64", "INT64", "UINT32", "INT32")


def _corrid_control(config) -> tuple[str, str] | None:
    if not config.HasField("sequence_batching"):
        return None
    kind = type(config.sequence_batching).Control.Kind.CONTROL_SEQUENCE_CORRID
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            if control.kind == kind:
                return control_input.name, from_config(_dtype_name(control.data_type))
    return None


def _check_corrid_type(req: DecodedRequest, corrid: tuple[str, str], model: str,
                       prefix: str) -> None:
    name, expected = corrid
    given = "BYTES" if isinstance(req.parameters.get("sequence_id"), str) else "UINT64"
    if (given == "BYTES") != (expected == "BYTES") or (
            given == "UINT64" and expected not in _CORRID_INTS):
        raise InferError(_INVALID, f"{prefix}sequence batching control '{name}' data-type "
                                   f"is '{given}', but model '{model}' expects '{expected}'")


def _input_count_error(spec: _ModelSpec, given: dict, model: str,
                       prefix: str) -> InferError:
    n_config = len(spec.input_order)
    n_required = len(spec.required)
    missing = [n for n in spec.required if n not in given]
    got = _names(given) if given else "[]"
    # Triton closes its list by overwriting the last character with ']': with nothing
    # missing that is the '[' (checked on 2.51: "missing required input(s) ].")
    missing_list = _names(missing) if missing else "]"
    if n_config == n_required:
        head = f"expected {n_config} inputs"
    else:
        head = f"expected number of inputs between {n_required} and {n_config}"
    return InferError(
        _INVALID,
        f"{prefix}{head} but got {len(given)} inputs for model '{model}'. Got input(s) "
        f"{got}, but missing required input(s) {missing_list}. Please provide all "
        f"required input(s).")


def shm_byte_size(name: str, params: dict, prefix: str = "") -> int:
    """The `shared_memory_byte_size` of a tensor that names a region in `params`, after
    checking the region's parameters (the size must be given: Triton's gRPC frontend
    says so, its HTTP one fails later on a size of 0)."""
    if type(params["shared_memory_region"]) is not str:
        raise InferError(_INVALID, f"{prefix}invalid value type for "
                         f"'shared_memory_region' parameter for tensor '{name}', "
                         "expected a string")
    if "shared_memory_byte_size" not in params:
        raise InferError(_INVALID, f"{prefix}'shared_memory_byte_size' must be specified "
                         f"along with 'shared_memory_region' parameter for tensor "
                         f"'{name}'")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        value = params.get(key, 0)
        if type(value) is not int or value < 0:
            raise InferError(_INVALID, f"{prefix}invalid value for '{key}' parameter for "
                             f"tensor '{name}': expected a non-negative integer, got "
                             f"{value!r}")
    return params["shared_memory_byte_size"]


def check_shm_input(inp, model: str, prefix: str = "") -> None:
    """Check an input in a client's shared-memory region: its byte size stands for the
    data's, so it must be what the datatype and shape say (as Triton, where the region
    is the input's buffer). BYTES sizes cannot be told from the shape; their length
    prefixes are in the region and Triton's frontend does not read them either."""
    if not inp.parameters or "shared_memory_region" not in inp.parameters:
        raise InferError(_INVALID, f"{prefix}unable to find data for input tensor "
                         f"'{inp.name}' for model '{model}' in request.")
    got = shm_byte_size(inp.name, inp.parameters, prefix)
    size = element_size(inp.datatype)
    if size is None:
        return
    count = 1
    for d in inp.shape:
        count *= d
    if got != size * count:
        raise InferError(
            _INVALID,
            f"{prefix}input byte size mismatch for input '{inp.name}' for model "
            f"'{model}'. Expected {size * count}, got {got}")


def check_input_byte_size(inp, model: str, prefix: str = "", lead: int = 0) -> None:
    """Check that an input's data holds exactly what its datatype and shape say
    (the shape past its first `lead` dimensions).

    For BYTES, walks the 4-byte length prefixes without copying the elements."""
    count = 1
    for d in inp.shape[lead:]:
        count *= d
    data = inp.data
    size = element_size(inp.datatype)
    if size is not None:
        got = len(data) if type(data) is bytes else memoryview(data).nbytes
        if got != size * count:
            raise InferError(
                _INVALID,
                f"{prefix}input byte size mismatch for input '{inp.name}' for model "
                f"'{model}'. Expected {size * count}, got {got}")
        return
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    end = len(view)
    pos = 0
    seen = 0
    while pos < end:
        if pos + 4 > end:
            raise InferError(
                _INVALID,
                f"{prefix}element byte size indicator exceeds the end of the buffer "
                f"for inference input '{inp.name}' for model '{model}'")
        seen += 1
        if seen > count:
            raise InferError(
                _INVALID,
                f"{prefix}unexpected number of string elements {seen} for inference "
                f"input '{inp.name}' for model '{model}', expecting {count}")
        pos += 4 + _LEN.unpack_from(view, pos)[0]
        if pos > end:
            raise InferError(
                _INVALID,
                f"{prefix}element byte size exceeds the end of the buffer for "
                f"inference input '{inp.name}' for model '{model}'")
    if seen != count:
        raise InferError(
            _INVALID,
            f"{prefix}expected {count} string elements for inference input "
            f"'{inp.name}' for model '{model}', got {seen}")
