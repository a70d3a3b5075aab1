"""DLPack capsules through ctypes, for what numpy's own DLPack cannot carry: BF16 (no
numpy dtype) and device memory. The python backend's Tensor.to_dlpack/from_dlpack use
them, and so does the fake CUDA runtime (shm/cuda_fake.py) for its arrays."""

from __future__ import annotations

import ctypes
import datetime
from typing import NamedTuple


class DLPackError(ValueError):
    """A capsule that is not an unconsumed 'dltensor' one."""


KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
DL_TO_TYPE = {(0, 8): "INT8", (0, 16): "INT16", (0, 32): "INT32", (0, 64): "INT64",
               (1, 8): "UINT8", (1, 16): "UINT16", (1, 32): "UINT32", (1, 64): "UINT64",
               (2, 16): "FP16", (2, 32): "FP32", (2, 64): "FP64", (4, 16): "BF16",
               (6, 8): "BOOL"}  # (DLDataTypeCode, bits)
_TYPE_TO_DL = {name: code_bits for code_bits, name in DL_TO_TYPE.items()}
CAPSULE_TYPE = type(datetime.datetime_CAPI)
_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


# Own prototypes, so the shared ctypes.pythonapi function objects stay untouched.
def _capi(name, restype, *argtypes):
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     ctypes.c_void_p)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object,
                         ctypes.c_char_p)
_capsule_rename = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# raw-pointer forms for the capsule destructor, which runs when the refcount is zero
_capsule_valid_raw = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_capsule_pointer_raw = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_char_p)

# address of each DLManagedTensor we handed out -> (struct, shape array, what it keeps alive)
_exported: dict[int, tuple] = {}


@_Deleter
def _release_export(address, _pop=_exported.pop):
    _pop(address, None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_gone(capsule, _pop=_exported.pop, _valid=_capsule_valid_raw,
                  _pointer=_capsule_pointer_raw, _name=_DLTENSOR):
    # A capsule nobody consumed still owns its tensor; a consumer calls the deleter itself.
    if _valid(capsule, _name):
        _pop(_pointer(capsule, _name), None)


def export(data: int, shape, datatype: str, device: tuple[int, int], keepalive,
               _gone=ctypes.cast(_capsule_gone, ctypes.c_void_p)):
    """A "dltensor" capsule over memory `keepalive` holds, C-contiguous, no copy.
    Fields are set in place, not through new structs and casts: a model's DLPack calls
    run per request (a third less per export)."""
    managed = _DLManagedTensor()
    dims = _SHAPE_TYPES[len(shape)](*shape) if len(shape) < 8 else \
        (ctypes.c_int64 * len(shape))(*shape)
    tensor = managed.dl_tensor
    tensor.data = data
    tensor.device.device_type, tensor.device.device_id = device
    tensor.ndim = len(shape)
    dtype = tensor.dtype
    (dtype.code, dtype.bits), dtype.lanes = _TYPE_TO_DL[datatype], 1
    tensor.shape = dims
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _exported[address] = (managed, dims, keepalive)
    return _capsule_new(address, _DLTENSOR, _gone)


_SHAPE_TYPES = [ctypes.c_int64 * n for n in range(8)]


class DLInfo(NamedTuple):
    address: int        # of the DLManagedTensor
    data: int           # first element (byte_offset applied)
    shape: tuple
    strides: tuple | None
    code: int
    bits: int
    lanes: int
    device: tuple[int, int]


def describe(capsule) -> DLInfo:
    """Read a capsule's tensor without taking it."""
    try:
        address = _capsule_pointer(capsule, _DLTENSOR)
    except ValueError:
        raise DLPackError(
            "DLPack capsule was already consumed or is not a 'dltensor' capsule") from None
    t = _DLManagedTensor.from_address(address).dl_tensor
    shape = tuple(t.shape[:t.ndim])
    strides = tuple(t.strides[:t.ndim]) if t.strides else None
    return DLInfo(address, (t.data or 0) + t.byte_offset, shape, strides, t.dtype.code,
                   t.dtype.bits, t.dtype.lanes, (t.device.device_type, t.device.device_id))


class DLImport:
    """Ownership of a consumed capsule's tensor: calls the producer's deleter when dropped."""

    __slots__ = ("address",)

    def __init__(self, capsule, info: DLInfo):
        _capsule_rename(capsule, _USED_DLTENSOR)
        self.address = info.address

    def __del__(self, _managed=_DLManagedTensor):  # bound now: may run at interpreter exit
        deleter = _managed.from_address(self.address).deleter
        if deleter:
            deleter(self.address)
