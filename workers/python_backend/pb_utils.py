"""Triton's `triton_python_backend_utils` API for `model.py` files, in pure Python.

Model files do `import triton_python_backend_utils as pb_utils`; that name resolves to this
module (the worker aliases it, and the top-level shim does for IDEs and tests). It offers
what Triton's python backend offers: the classes its C++ stub binds (Tensor,
InferenceRequest, InferenceResponse, TritonError, Logger, ...) and the helpers of its
Python utils file, with Triton's names, defaults and error rules.

Nothing here starts processes or opens sockets. The worker builds requests with
`Tensor._from_server` and `InferenceRequest._from_server`, reads results back with
`Tensor._datatype` / `Tensor._host_array()`, and may plug in the hooks at the bottom of
this module (`_bls_executor`, `_model_control`, `_model_dir`). Until a hook is set, the
feature behind it raises TritonModelException("... is not supported yet").
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import enum
import json
import logging
import sys

import numpy as np

from shm import datatypes as _dt
from shm.dlpack import (CAPSULE_TYPE, DL_TO_TYPE, KDL_CPU, KDL_CUDA, KDL_CUDA_HOST,
                       DLImport, DLInfo, DLPackError, describe, export)
from shm.errors import ErrorCode

__all__ = [
    "TritonError", "TritonModelException", "Tensor", "InferenceRequest",
    "InferenceResponse", "InferenceResponseSender", "Logger", "LogLevel", "ModelConfig",
    "PreferredMemory", "InferenceTrace", "MetricFamily", "Metric",
    "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor", "deserialize_bytes_tensor", "get_input_tensor_by_name",
    "get_output_tensor_by_name", "get_input_config_by_name", "get_output_config_by_name",
    "using_decoupled_model_transaction_policy", "triton_to_numpy_type",
    "numpy_to_triton_type", "triton_string_to_numpy", "load_model", "unload_model",
    "is_model_ready", "get_model_dir",
]

# tritonserver.h flag values
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class TritonModelException(Exception):
    """Raised by this API on misuse, and by models to fail initialize/execute/finalize."""


class TritonError:
    """An error a model attaches to an InferenceResponse; codes are TRITONSERVER_Error_Code."""

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL):
        if not isinstance(message, str):
            raise TypeError(f"TritonError message must be a str, got {type(message).__name__}")
        try:
            self._code = ErrorCode(code)
        except ValueError:
            raise ValueError(f"{code!r} is not a TritonError code") from None
        self._message = message

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


# -- datatypes ------------------------------------------------------------------

# TRITONSERVER_DataType values
_TYPE_ENUM = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6,
              "INT16": 7, "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12,
              "BYTES": 13, "BF16": 14}
_ENUM_NUMPY = {_TYPE_ENUM[name]: dt.type for name, dt in _dt.NUMPY.items() if name != "BF16"}
# numpy dtype -> protocol datatype; BF16 has no numpy dtype, 'S' arrays are BYTES too
_NUMPY_TYPE = {dt: name for name, dt in _dt.NUMPY.items() if name != "BF16"}

# Triton maps TYPE_BOOL to Python's bool and has no entry for TYPE_BF16.
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def _datatype_of(dtype) -> str | None:
    """Protocol datatype of a numpy dtype as Triton's Tensor accepts it; None if not."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    if dt.kind == "S":
        return "BYTES"
    return _NUMPY_TYPE.get(dt)


def triton_to_numpy_type(data_type: int):
    """TRITONSERVER_DataType value -> numpy scalar type (np.object_ for BYTES); None if
    numpy has no such type (BF16) or the value is unknown."""
    return _ENUM_NUMPY.get(data_type)


def numpy_to_triton_type(data_type) -> int | None:
    """numpy dtype -> TRITONSERVER_DataType value (13 for object and bytes); None if the
    dtype has no Triton datatype (numpy str arrays included, as in Triton)."""
    datatype = _datatype_of(data_type)
    return None if datatype is None else _TYPE_ENUM[datatype]


def triton_string_to_numpy(triton_type_string: str):
    """'TYPE_FP32' -> np.float32, 'TYPE_STRING' -> np.object_; KeyError if unknown."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """A BYTES tensor (object or bytes_ array) as length-prefixed elements in C order;
    str elements are UTF-8 encoded, others go through str(). None for other dtypes."""
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype.kind not in "OS":
        return None
    return _dt.serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor) -> np.ndarray:
    """Length-prefixed elements -> a flat object array of bytes."""
    return _dt.deserialize_bytes(encoded_tensor)


# -- DLPack ---------------------------------------------------------------------
# numpy imports and exports CPU tensors of its own dtypes; BF16 (no numpy dtype) and
# device memory need the DLPack structs themselves (shm/dlpack.py).

def _dl_describe(capsule) -> DLInfo:
    """Read a capsule's tensor without taking it."""
    try:
        return describe(capsule)
    except DLPackError as e:
        raise TritonModelException(str(e)) from None


class _CapsuleSource:
    """Presents a bare capsule to numpy.from_dlpack, which wants an object."""

    __slots__ = ("capsule",)

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None):
        return self.capsule

    def __dlpack_device__(self):
        return (KDL_CPU, 0)


def _is_c_contiguous(shape, strides) -> bool:
    if strides is None or 0 in shape:
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1:  # a unit dimension's stride says nothing (Triton skips them too)
            if stride != expected:
                return False
            expected *= dim
    return True


class _DeviceBuffer:
    """Device memory a Tensor refers to (e.g. a CUDA tensor given to from_dlpack)."""

    __slots__ = ("owner", "data", "shape", "device")

    def __init__(self, owner, data: int, shape: tuple, device: tuple[int, int]):
        self.owner, self.data, self.shape, self.device = owner, data, shape, device


# -- tensors --------------------------------------------------------------------

def _check_name(name) -> None:
    if not isinstance(name, str):
        raise TypeError(f"Tensor name must be a str, got {type(name).__name__}")
    if not name:
        raise TritonModelException("Tensor name cannot be an empty string.")


class Tensor:
    """A named tensor: a numpy array on the host, or device memory from DLPack.

    BYTES tensors are object (or bytes_) arrays; BF16 tensors have no numpy form and are
    reached through DLPack, as in Triton.
    """

    __slots__ = ("_name", "_datatype", "_array", "_device")

    def __init__(self, name: str, numpy_array):
        _check_name(name)
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        datatype = _datatype_of(array.dtype)
        if datatype is None:
            hint = "; use dtype=object (or bytes) for BYTES" if array.dtype.kind == "U" else ""
            raise TritonModelException(f"NumPy dtype {array.dtype} is not supported{hint}.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # Triton copies these too
        self._name, self._datatype, self._array, self._device = name, datatype, array, None

    @classmethod
    def _from_server(cls, name: str, datatype: str, array: np.ndarray) -> Tensor:
        """Server side: wrap an input as shm.datatypes reads it (BF16 as uint16 words,
        BYTES as an object array), without checks or copies."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._datatype, tensor._array, tensor._device = (
            name, datatype, array, None)
        return tensor

    @classmethod
    def _from_server_device(cls, name: str, datatype: str, data: int, shape: tuple,
                            device_id: int, owner) -> Tensor:
        """Server side: wrap CUDA memory at `data` (kept alive by `owner`), as
        from_dlpack would but without a capsule to export and import."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._datatype, tensor._array = name, datatype, None
        tensor._device = _DeviceBuffer(owner, data, tuple(shape), (KDL_CUDA, device_id))
        return tensor

    def _device_memory(self) -> tuple[int, tuple, int] | None:
        """Server side: (address, shape, device id) of a CUDA tensor, None on the host."""
        buf = self._device
        return None if buf is None else (buf.data, tuple(buf.shape), buf.device[1])

    def _host_array(self) -> np.ndarray:
        """Server side: the host array in Triton's layout (BF16 as uint16 words).
        Raises for device tensors, which the server must copy or share itself."""
        if self._device is not None:
            raise TritonModelException(f"tensor '{self._name}' is in device memory")
        return self._array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The array this tensor wraps (not a copy)."""
        if self._device is not None:
            raise TritonModelException(
                "Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() "
                "and from_dlpack() instead.")
        return self._array

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType value (e.g. 11 for FP32)."""
        return _TYPE_ENUM[self._datatype]

    def shape(self) -> list[int]:
        return list(self._device.shape if self._device is not None else self._array.shape)

    def is_cpu(self) -> bool:
        return self._device is None

    def to_dlpack(self):
        """A DLPack capsule over this tensor's memory (no copy)."""
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._device is not None:
            buf = self._device
            return export(buf.data, buf.shape, self._datatype, buf.device, buf)
        array = self._array
        return export(array.__array_interface__["data"][0], array.shape, self._datatype,
                          (KDL_CPU, 0), array)

    def __dlpack__(self, stream=None):
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device.device if self._device is not None else (KDL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, tensor) -> Tensor:
        """A Tensor over a DLPack capsule's memory, or over any object with `__dlpack__`
        and `__dlpack_device__` (numpy, torch, cupy...), without copying. Only
        C-contiguous tensors are accepted."""
        _check_name(name)
        if isinstance(tensor, CAPSULE_TYPE):
            capsule = tensor
        elif hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__"):
            device_type = tensor.__dlpack_device__()[0]
            if device_type not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):
                raise TritonModelException(
                    f"DLDevice type {device_type} is not supported by the python backend.")
            # stream=None: the producer syncs with the legacy default stream (array API)
            capsule = tensor.__dlpack__(stream=None)
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes")
        return Tensor._from_capsule(name, capsule)

    @classmethod
    def _from_capsule(cls, name: str, capsule) -> Tensor:
        info = _dl_describe(capsule)
        datatype = DL_TO_TYPE.get((info.code, info.bits)) if info.lanes == 1 else None
        if datatype is None:
            raise TritonModelException(
                f"DLPack dtype (code {info.code}, {info.bits} bits, {info.lanes} lanes) is "
                "not supported.")
        if not _is_c_contiguous(info.shape, info.strides):
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
                "stored in C-Order are supported.")
        device_type = info.device[0]
        tensor = cls.__new__(cls)
        tensor._name, tensor._datatype, tensor._array, tensor._device = (
            name, datatype, None, None)
        if device_type == KDL_CUDA:
            tensor._device = _DeviceBuffer(DLImport(capsule, info), info.data, info.shape,
                                           info.device)
        elif device_type not in (KDL_CPU, KDL_CUDA_HOST):
            raise TritonModelException(
                f"DLDevice type {device_type} is not supported by the python backend.")
        elif datatype != "BF16":
            tensor._array = np.from_dlpack(_CapsuleSource(capsule))
        else:
            tensor._array = _host_view(DLImport(capsule, info), info.data, info.shape)
        return tensor

    def __repr__(self) -> str:
        where = "cpu" if self._device is None else f"device {self._device.device}"
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()}, {where})"


def _host_view(owner: DLImport, data: int, shape: tuple) -> np.ndarray:
    """BF16 words in host memory a capsule gave us, as a uint16 array that keeps `owner`."""
    count = 1
    for dim in shape:
        count *= dim
    if count == 0:
        return np.empty(shape, dtype=np.uint16)
    buf = (ctypes.c_uint16 * count).from_address(data)
    buf._owner = owner  # the array's base is `buf`, so the producer outlives every view
    return np.frombuffer(buf, dtype=np.uint16).reshape(shape)


# -- requests and responses -------------------------------------------------------

def _parameters_json(parameters) -> str:
    """Triton's rule for request/response parameters: a dict of str -> bool/int/str."""
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(
            f"Expect parameters to be a dict, got {type(parameters).__name__}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key).__name__}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value).__name__}")
    return json.dumps(parameters)


def _tensor_list(tensors, what: str) -> list[Tensor]:
    tensors = list(tensors)
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{what} must be pb_utils.Tensor objects, got {type(tensor).__name__}")
    return tensors


class InferenceResponse:
    """The answer to one request: output tensors, or an error (then outputs are ignored)."""

    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(self, output_tensors=(), error: TritonError | None = None, parameters=None):
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a pb_utils.TritonError, got {type(error).__name__}")
        self._output_tensors = _tensor_list(output_tensors or (), "output_tensors")
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return self._parameters


class InferenceResponseSender:
    """Sends responses for one request (decoupled models; one final response otherwise).

    `send` is the worker's transport: send(response_or_None, flags).
    """

    __slots__ = ("_send", "_decoupled", "_cancelled", "_closed", "_sent")

    def __init__(self, send, decoupled: bool, is_cancelled=None):
        self._send, self._decoupled, self._cancelled = send, decoupled, is_cancelled
        self._closed, self._sent = False, 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set "
                "to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                f"response must be a pb_utils.InferenceResponse, got {type(response).__name__}")
        self._update_state(response, flags)
        self._send(response, flags)

    def is_cancelled(self) -> bool:
        return self._cancelled is not None and bool(self._cancelled())

    def _update_state(self, response, flags: int) -> None:
        """Triton's bookkeeping, also used by the worker for responses `execute` returns."""
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response.")
            if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL \
                    and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response.")
        if self._closed:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed.")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        self._sent += 1

    def _is_closed(self) -> bool:
        return self._closed

    def _close(self) -> None:
        self._closed = True


class MemoryType(enum.IntEnum):
    """Where a BLS caller wants its output tensors (Triton's PreferredMemory::MemoryType)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
    DEFAULT = 2


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Memory type and device a BLS request wants its outputs in."""

    __slots__ = ("_type", "_device_id")

    def __init__(self, preferred_memory_type, preferred_device_id: int = 0):
        self._type = MemoryType(preferred_memory_type)
        self._device_id = int(preferred_device_id)


class InferenceTrace:
    """The trace a request belongs to; `get_context()` is None when it is not traced."""

    __slots__ = ("_context",)

    def __init__(self, context: str | None = None):
        self._context = context or None

    def get_context(self) -> str | None:
        return self._context


class InferenceRequest:
    """A request given to `execute()`, or built by a model for a BLS call.

    The public constructor is Triton's BLS one; the worker uses `_from_server`.
    """

    __slots__ = ("_request_id", "_correlation_id", "_inputs", "_requested_output_names",
                 "_model_name", "_model_version", "_flags", "_timeout", "_parameters",
                 "_preferred_memory", "_trace", "_decoupled", "_send_response",
                 "_is_cancelled", "_sender", "_release_flags")

    def __init__(self, request_id: str = "", correlation_id: int | str = 0, inputs=None,
                 requested_output_names=None, model_name: str | None = None,
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters=None):
        for arg, value in (("inputs", inputs), ("requested_output_names",
                                                requested_output_names),
                           ("model_name", model_name)):
            if value is None:
                raise TypeError(f"InferenceRequest() missing required argument '{arg}'")
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TypeError("preferred_memory must be a pb_utils.PreferredMemory")
        self._request_id = str(request_id)
        self._correlation_id = correlation_id
        self._inputs = _tensor_list(inputs, "inputs")
        self._requested_output_names = set(requested_output_names)
        self._model_name = str(model_name)
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = _parameters_json(parameters)
        self._preferred_memory = preferred_memory or PreferredMemory(MemoryType.DEFAULT, 0)
        self._trace = trace or InferenceTrace()
        self._decoupled = False
        self._send_response = self._is_cancelled = self._sender = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _from_server(cls, *, inputs: list[Tensor], request_id: str = "",
                     correlation_id: int | str = 0, requested_output_names=(),
                     flags: int = 0, parameters_json: str = "{}", model_name: str = "",
                     model_version: int = -1, timeout: int = 0, decoupled: bool = False,
                     send_response=None, is_cancelled=None,
                     trace_context: str | None = None) -> InferenceRequest:
        """Server side: the request handed to `execute()`. No validation, no copies.

        inputs: Tensors (e.g. from `Tensor._from_server`); requested_output_names: the
        outputs the client asked for (all of them when it named none, as in Triton);
        parameters_json: the request parameters as a JSON object string; timeout: in
        microseconds; send_response(response_or_None, flags): the transport behind
        `get_response_sender()` (left None, that call raises "not supported yet");
        is_cancelled(): whether the client cancelled; decoupled: the model's
        transaction policy, for the sender's one-response rule.
        """
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = set(requested_output_names)
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters_json
        request._preferred_memory = None
        request._trace = InferenceTrace(trace_context)
        request._decoupled = decoupled
        request._send_response = send_response
        request._is_cancelled = is_cancelled
        request._sender = None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON object string (use json.loads)."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        return self._trace

    def requested_output_names(self) -> set[str]:
        return self._requested_output_names

    def is_cancelled(self) -> bool:
        return self._is_cancelled is not None and bool(self._is_cancelled())

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            if self._send_response is None:
                raise TritonModelException(
                    "InferenceRequest.get_response_sender() is not supported yet")
            self._sender = InferenceResponseSender(self._send_response, self._decoupled,
                                                   self._is_cancelled)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE asks to run this request again (models
        with iterative sequence batching); the worker reads `_release_flags`."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL,
                         TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unsupported request release flags {flags!r}")
        self._release_flags = flags

    def exec(self, decoupled: bool = False):
        """Run this request on `model_name` (BLS): an InferenceResponse, or an iterator
        of them with decoupled=True."""
        if _bls_executor is None:
            raise TritonModelException("BLS is not supported yet")
        return _bls_executor(self, decoupled)

    def async_exec(self, decoupled: bool = False):
        """Run this request on `model_name` without blocking the running loop: an
        awaitable of what exec() returns."""
        if _bls_async_executor is not None:
            return _bls_async_executor(self, decoupled)
        if _bls_executor is None:
            raise TritonModelException("BLS is not supported yet")
        return asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)

    def __repr__(self) -> str:
        names = [t.name() for t in self._inputs]
        return f"InferenceRequest(id={self._request_id!r}, inputs={names})"


# -- logging --------------------------------------------------------------------

_model_log = logging.getLogger("shmserve.model")


class Logger:
    """Triton's model logger: records go to the `shmserve.model` logger, stamped with the
    calling file and line. VERBOSE is logging.DEBUG, shown with --log-verbose."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _emit(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, Logger.VERBOSE)


LogLevel = Logger.LogLevel
_LOGGING_LEVEL = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
                  LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}


def _emit(message, level) -> None:
    py_level = _LOGGING_LEVEL[LogLevel(level)]
    if not _model_log.isEnabledFor(py_level):
        return
    caller = sys._getframe(2)  # _emit <- Logger method <- model code
    record = _model_log.makeRecord(
        _model_log.name, py_level, caller.f_code.co_filename, caller.f_lineno, str(message),
        None, None, caller.f_code.co_name)
    _model_log.handle(record)


# -- auto-complete --------------------------------------------------------------

class ModelConfig:
    """The config given to `auto_complete_config()`; the one it returns is used.

    Built from the config as a JSON string (as Triton passes it) or a dict (copied).
    Errors are ValueError, as in Triton.
    """

    def __init__(self, model_config):
        if isinstance(model_config, (str, bytes, bytearray)):
            config = json.loads(model_config)
        elif isinstance(model_config, dict):
            config = copy.deepcopy(model_config)
        else:
            raise TypeError(f"ModelConfig takes a JSON string or a dict, "
                            f"got {type(model_config).__name__}")
        for key, default in (("max_batch_size", 0), ("input", []), ("output", [])):
            config.setdefault(key, default)
        self._model_config = config

    def as_dict(self) -> dict:
        return self._model_config

    def _name(self) -> str:
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises if the config already asks for a larger max_batch_size."""
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Adds an empty dynamic_batching unless present; raises if another scheduler is
        configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:
        """Adds an input {name, data_type, dims[, optional]}, or completes one of the same
        name; raises on a conflicting data_type, dims or optional."""
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        """Adds an output {name, data_type, dims}, or completes one of the same name;
        raises on a conflicting data_type or dims."""
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict, allowed: tuple[str, ...]) -> None:
        model, name = self._name(), tensor.get("name")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{model}' "
                f"contains property other than {', '.join(repr(k) for k in allowed)}: "
                f"{', '.join(map(repr, extra))}.")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                subject = f"{kind} '{name}'" if key != "name" else kind
                raise ValueError(
                    f"{subject} in auto-complete-config function for model '{model}' is "
                    f"missing '{key}' property.")
        for existing in self._model_config[kind]:
            if existing.get("name") != name:
                continue
            have_type = existing.get("data_type", "TYPE_INVALID")
            if have_type != "TYPE_INVALID" and have_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{have_type} for {kind} '{name}', model provides {tensor['data_type']}")
            have_dims = existing.get("dims")
            if have_dims and list(have_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(have_dims)}")
            if "optional" in existing and "optional" in tensor \
                    and existing["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{existing['optional']}")
            existing["data_type"] = tensor["data_type"]
            existing["dims"] = tensor["dims"]
            if "optional" in tensor:
                existing["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        """Sets model_transaction_policy.decoupled; raises on other keys, or on changing a
        decoupled value the config already sets."""
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{model}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{model}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted


# -- custom metrics ---------------------------------------------------------------
# Values are kept in the model's process; they are not yet exported on the metrics port.

class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class Metric:
    """One labelled series of a MetricFamily."""

    def __init__(self, kind: MetricKind, labels: dict, buckets):
        self._kind, self.labels, self._buckets = kind, dict(labels), buckets
        self._value = 0.0
        self._counts = [0] * (len(buckets) + 1) if buckets is not None else None

    def increment(self, value: float) -> None:
        if self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("increment() is not allowed on a histogram metric")
        if self._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException("a counter metric cannot be incremented by a "
                                       "negative value")
        self._value += value

    def set(self, value: float) -> None:
        if self._kind != MetricKind.GAUGE:
            raise TritonModelException("set() is only allowed on a gauge metric")
        self._value = float(value)

    def observe(self, value: float) -> None:
        if self._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("observe() is only allowed on a histogram metric")
        index = next((i for i, b in enumerate(self._buckets) if value <= b), len(self._buckets))
        self._counts[index] += 1
        self._value += value  # the histogram's sum

    def value(self) -> float:
        if self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("value() is not allowed on a histogram metric")
        return self._value


class MetricFamily:
    """A named custom metric; `Metric(labels)` creates its series."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind):
        if not isinstance(name, str) or not name:
            raise TritonModelException("metric family name must be a non-empty str")
        self.name, self.description, self.kind = name, description, MetricKind(kind)
        self.metrics: list[Metric] = []
        _metric_families.append(self)

    def Metric(self, labels: dict | None = None, buckets=None) -> Metric:  # noqa: N802
        labels = labels or {}
        if self.kind == MetricKind.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("a histogram metric needs buckets")
            buckets = sorted(float(b) for b in buckets)
        elif buckets is not None:
            raise TritonModelException("buckets are only allowed on a histogram metric")
        metric = Metric(self.kind, labels, buckets)
        self.metrics.append(metric)
        return metric


# -- model loading and paths -----------------------------------------------------

def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load (or reload) a model, with an optional JSON config and override files."""
    _model_control_or_raise().load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _model_control_or_raise().unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return _model_control_or_raise().is_model_ready(model_name, model_version)


def _model_control_or_raise():
    if _model_control is None:
        raise TritonModelException("The model loading API is not supported yet")
    return _model_control


def get_model_dir() -> str:
    """The directory of the running model's model.py."""
    if _model_dir is None:
        raise TritonModelException("get_model_dir() is only available inside a served model")
    return _model_dir


# -- lookups ----------------------------------------------------------------------

def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse,
                              name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((c for c in model_config.get("input", ()) if c["name"] == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((c for c in model_config.get("output", ()) if c["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# -- worker hooks -----------------------------------------------------------------
# Set on this module by the worker; None means the feature is not available.

# _bls_executor(request: InferenceRequest, decoupled: bool) -> InferenceResponse, or an
# iterator of InferenceResponse when decoupled; called by InferenceRequest.exec().
_bls_executor = None
# _bls_async_executor(request, decoupled) -> a coroutine of what _bls_executor returns,
# awaited on the loop that runs the model's `async def execute`
_bls_async_executor = None
# object with load_model(name, config, files), unload_model(name, unload_dependents),
# is_model_ready(name, version) -> bool
_model_control = None
# directory of the model.py being served, for get_model_dir()
_model_dir: str | None = None
# every MetricFamily created in this process, for a future exporter
_metric_families: list[MetricFamily] = []
