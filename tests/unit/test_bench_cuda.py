"""The bench's CUDA regions through cupy (scheduler/bench/cuda.py), against a fake cupy
whose device memory is host bytes: what goes in comes out, the handle travels in
base64 as tritonclient's does, and the choice between cupy and tritonclient's module."""

import base64
import sys
import types

import numpy as np
import pytest

from scheduler.bench import cuda as bench_cuda


class _Device:
    current = None

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        self.prev, _Device.current = _Device.current, self.index
        return self

    def __exit__(self, *exc):
        _Device.current = self.prev


class _Runtime:
    """cudaMalloc, cudaIpcGetMemHandle, cudaMemcpy and cudaFree over host buffers; a
    pointer is a buffer's address, so memcpy can tell host from device as UVA does."""

    def __init__(self):
        self.buffers: dict[int, np.ndarray] = {}
        self.devices: dict[int, int] = {}

    def malloc(self, size):
        buf = np.zeros(size, np.uint8)
        self.buffers[buf.ctypes.data] = buf
        self.devices[buf.ctypes.data] = _Device.current
        return buf.ctypes.data

    def ipcGetMemHandle(self, ptr):
        assert ptr in self.buffers, "a handle names a whole allocation"
        return ptr.to_bytes(8, "little") + bytes(56)

    def memcpy(self, dst, src, size, kind):
        assert kind == 4  # cudaMemcpyDefault
        assert self._inside(dst, size) or self._inside(src, size)
        import ctypes
        ctypes.memmove(dst, src, size)

    def _inside(self, ptr, size):
        return any(base <= ptr and ptr + size <= base + b.nbytes
                   for base, b in self.buffers.items())

    def free(self, ptr):
        del self.buffers[ptr]


@pytest.fixture
def cupy(monkeypatch):
    runtime = _Runtime()
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=_Device, runtime=runtime))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return runtime


def test_region_round_trip_and_handle(cupy):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    region = bench_cuda.create_shared_memory_region("r0", x.nbytes + 16, 1)
    assert cupy.devices[region.ptr] == 1  # allocated on the asked device
    bench_cuda.set_shared_memory_region(region, [x])
    np.testing.assert_array_equal(bench_cuda.get_contents_as_numpy(region, np.float32,
                                                                   (3, 4)), x)
    # tritonclient's form: the raw 64-byte cudaIpcMemHandle_t in base64
    raw = base64.b64decode(bench_cuda.get_raw_handle(region))
    assert len(raw) == 64 and int.from_bytes(raw[:8], "little") == region.ptr
    with pytest.raises(ValueError, match="overflow"):
        bench_cuda.set_shared_memory_region(region, [x, x])
    with pytest.raises(ValueError, match="holds"):
        bench_cuda.get_contents_as_numpy(region, np.float32, (8, 4))
    bench_cuda.destroy_shared_memory_region(region)
    assert cupy.buffers == {}
    bench_cuda.destroy_shared_memory_region(region)  # twice: nothing more to free


def test_values_follow_each_other_and_bytes_are_serialized(cupy):
    from tritonclient.utils import serialize_byte_tensor
    region = bench_cuda.create_shared_memory_region("r1", 64, 0)
    a, b = np.ones(2, np.int32), np.full(2, 7, np.int32)
    bench_cuda.set_shared_memory_region(region, [a, b])
    np.testing.assert_array_equal(bench_cuda.get_contents_as_numpy(region, np.int32, (4,)),
                                  [1, 1, 7, 7])
    text = serialize_byte_tensor(np.array([b"ab", b"c"], dtype=object))
    bench_cuda.set_shared_memory_region(region, [text])
    got = bench_cuda.get_contents_as_numpy(region, np.uint8, (len(text.item()),))
    assert got.tobytes() == text.item()


def test_regions_prefers_cupy_then_tritonclient(monkeypatch, cupy):
    assert bench_cuda.regions() is bench_cuda and bench_cuda.name() == "cupy"
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails
    other = types.ModuleType("tritonclient.utils.cuda_shared_memory")
    monkeypatch.setitem(sys.modules, "tritonclient.utils.cuda_shared_memory", other)
    assert bench_cuda.regions() is other
    monkeypatch.setitem(sys.modules, "tritonclient.utils.cuda_shared_memory", None)
    with pytest.raises(RuntimeError, match="needs cupy"):
        bench_cuda.regions()
