"""Tensors in and out of a worker: descriptors to arrays, arrays to descriptors.

Inputs are read where they lie: inline message bytes, a frontend's arena block (numpy
views, no copy), or a client's CUDA region (a cupy array over the IPC mapping). A
client's system region is the exception: its client may shrink it at any moment, so it
is read once, with preadv, into memory of the worker's own (shm/regions.py says why),
straight into the batch tensor where requests are gathered. A GPU instance's device
copies from a pinned system region instead (`dma`). Outputs are written once: inline
when small, into a block of this worker's arena, or into the region the client named
for them (pwrite for a system region). Every copy a worker makes is counted in
`Copies`, per instance, so tests and benchmarks can check the copies the design
promises instead of assuming them.

Framework instances run on their own threads, so everything here that is shared
(arena, segment and region caches) is safe to call from several threads.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from shm import datatypes
from shm.arena import Arena, SegmentCache, address_of
from shm.devices import PEER, STAGED, region_plan
from shm.errors import ErrorCode, InferError
from shm.regions import RegionMaps
from shm.tensor import INLINE_MAX, TensorRef, arena_blocks

# A system-region input smaller than this goes to a device through a host copy even
# where the region is pinned: a host-to-device copy call costs ~10 us whatever its
# size, so small ones are joined on the host first (workers/framework.py), which a
# view the CPU must not touch could not be.
DMA_MIN = 64 << 10


# A request's result when the model answered it itself, response by response, as it
# sent them (a python model's response sender): the batch sends nothing more for it.
# ANSWERED_FAILED: the same, its last response an error (counted as a failure).
ANSWERED = object()
ANSWERED_FAILED = object()


class ErrorResponse(InferError):
    """The model's own answer to a request was an error (a python model's
    `InferenceResponse(error=...)`): the client gets the error, but the execution
    succeeded, and Triton's statistics count the request as a success (its python
    backend reports success for every request it holds a response for). Clients and
    dashboards that compare success counts between the two servers depend on it."""


class Copies:
    """Bytes copied, by kind: host (host to host), h2d, d2h, d2d; and how many copy
    calls crossed to or from a device, or within one (`*_ops`: a call costs ~10 us
    whatever its size, so their number matters as much as the bytes)."""

    __slots__ = ("host", "h2d", "d2h", "d2d", "h2d_ops", "d2h_ops", "d2d_ops")

    def __init__(self):
        self.host = self.h2d = self.d2h = self.d2d = 0
        self.h2d_ops = self.d2h_ops = self.d2d_ops = 0

    def as_list(self) -> list[int]:
        return [self.host, self.h2d, self.d2h, self.d2d]

    def to_device(self, nbytes: int) -> None:
        """One host-to-device copy call of `nbytes`."""
        self.h2d += nbytes
        self.h2d_ops += 1

    def to_host(self, nbytes: int) -> None:
        """One device-to-host copy call of `nbytes`."""
        self.d2h += nbytes
        self.d2h_ops += 1

    def on_device(self, nbytes: int) -> None:
        """One device-to-device copy call of `nbytes`."""
        self.d2d += nbytes
        self.d2d_ops += 1


def is_device_array(array) -> bool:
    return hasattr(array, "__cuda_array_interface__")


class DeviceView:
    """C-contiguous device memory by its address: what the python backend hands a model
    as a client region's input, and takes back as a device output. Cheaper per request
    than a cupy array with a DLPack export and import on each side (~100 us of Python
    and ctypes per tensor, measured with shm/cuda_fake.py): a copy into a client's CUDA
    region needs only the two addresses. `owner` keeps the memory alive."""

    __slots__ = ("ptr", "shape", "dtype", "nbytes", "device", "owner")

    def __init__(self, ptr: int, shape: tuple, dtype, nbytes: int, device: int, owner):
        self.ptr, self.shape, self.dtype, self.nbytes = ptr, shape, dtype, nbytes
        self.device, self.owner = device, owner

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def reshape(self, shape) -> "DeviceView":
        return DeviceView(self.ptr, tuple(shape), self.dtype, self.nbytes, self.device,
                          self.owner)

    def as_cupy(self):
        """A cupy array over the same memory (no copy), for the paths that need one."""
        from shm.cuda import cupy
        cp = cupy()
        mem = cp.cuda.UnownedMemory(self.ptr, self.nbytes, self.owner, self.device)
        return cp.ndarray(self.shape, dtype=self.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))


def copy_on_device(dest, src, stream=None) -> None:
    """dest[...] = src between cupy arrays: one async memcpy on `stream` (None: the
    current one) when both are contiguous and alike, which costs less than the copy
    kernel and the Python around it that cupy's assignment launches."""
    if dest.flags.c_contiguous and src.flags.c_contiguous and dest.dtype == src.dtype:
        dest.data.copy_from_device_async(src.data, src.nbytes, stream)
    else:
        dest[...] = src


# cudaMemcpyDefault: the driver tells the devices apart by the pointers (UVA)
_MEMCPY_DEFAULT = 4


def _cupy():
    from shm.cuda import cupy
    return cupy()


@functools.cache
def can_access_peer(device: int, peer: int) -> bool:
    """Whether `device` reaches `peer`'s memory directly (cudaDeviceCanAccessPeer)."""
    return bool(_cupy().cuda.runtime.deviceCanAccessPeer(device, peer))


def onto_device(array, device: int):
    """A cupy array on another device, copied onto `device` with one peer copy on the
    current stream (cupy enables peer access where the two GPUs allow it; where not,
    the driver stages the copy through host memory)."""
    cp = _cupy()
    with cp.cuda.Device(device):
        out = cp.empty(array.shape, array.dtype)
    copy_on_device(out, array)
    return out


class TensorIO:
    """Where a worker's tensors come from and go to. `device`: the GPU of a device
    worker (None on the CPU), where client CUDA regions on other GPUs are copied to."""

    def __init__(self, arena: Arena, owner: str, pin=None, unpin=None,
                 device: int | None = None):
        self.arena = arena
        self.owner = owner
        self.device = device
        # a segment pinned when first mapped is unpinned before it is unmapped (its
        # owner gave it back, or died), or its pinned pages would outlive it
        self.segments = SegmentCache(on_map=pin, on_unmap=unpinner(unpin))
        self.regions = RegionMaps(pin, unpin)
        self._lock = threading.Lock()  # the arena and `_held`, shared by threads
        # .unsynced: this thread queued a copy into a client's CUDA region on its
        # current stream and has not waited for it yet
        self._local = threading.local()
        # blocks each reader holds, so a reader that dies does not leak them
        self._held: dict[str, set[tuple[str, int]]] = {}

    # -- inputs -----------------------------------------------------------------------

    def input(self, ref: TensorRef, copies: Copies | None = None, dma: bool = False):
        """The input as an array: numpy for host bytes, cupy for bytes in a client's
        CUDA region; without copying, except a client's system region, which is read
        into memory of our own (one host copy, counted in `copies`). With `dma`, for a
        device to copy from and nothing else: a large one in a pinned system region is
        a view over it instead."""
        local = getattr(ref, "array", None)  # workers/sequence.py LocalTensor
        if local is not None:
            return local
        if ref.data is not None:
            buf = ref.data
        elif ref.region <= 0:
            buf = self.segments.view(ref.segment, ref.offset, ref.nbytes)
        elif ref.device < 0:
            buf = None
            if dma and ref.nbytes >= DMA_MIN and ref.datatype != "BYTES":
                buf = self.regions.dma_view(ref.region, ref.segment, ref.offset,
                                            ref.nbytes, ref.region_name,
                                            f"input '{ref.name}'")
            if buf is None:
                buf = self.read_region(ref, copies)
        else:
            region = self.regions.cuda(ref.region, ref.handle, ref.device, ref.region_size)
            dtype = _device_dtype(ref)
            array = region.array(ref.offset, ref.nbytes, dtype, tuple(ref.shape))
            if self.device is not None and region_plan(
                    ref.device, self.device, can_access_peer).copy in (PEER, STAGED):
                # the model runs on another GPU than the region lives on: its input
                # must be on the model's device (one device-to-device copy)
                array = onto_device(array, self.device)
                if copies is not None:
                    copies.on_device(ref.nbytes)
            return array
        return datatypes.tensor_from_buffer(ref.datatype, ref.shape, buf)

    def device_input(self, ref: TensorRef) -> DeviceView:
        """A client's CUDA-region input (ref.device >= 0) by address: no cupy array."""
        region = self.regions.cuda(ref.region, ref.handle, ref.device, ref.region_size)
        dtype = _device_dtype(ref)
        region.check(ref.offset, ref.nbytes)
        return DeviceView(region.ptr + ref.offset, tuple(ref.shape), dtype, ref.nbytes,
                          ref.device, region)

    def host_input(self, ref: TensorRef, copies: Copies) -> np.ndarray:
        """The input in host memory: in place, or one copy (see `input`)."""
        array = self.input(ref, copies)
        if is_device_array(array):
            copies.to_host(array.nbytes)
            return array.get()
        return array

    def read_region(self, ref: TensorRef, copies: Copies | None, out=None) -> np.ndarray:
        """A system-region input's bytes, read into `out` (an array of its nbytes, e.g.
        the request's rows of a batch tensor) or new memory: RegionTruncated (an
        InferError) when its client shrank the object under them."""
        buf = self.regions.read(ref.region, ref.segment, ref.offset, ref.nbytes, out,
                                ref.region_name, f"input '{ref.name}'")
        if copies is not None:
            copies.host += ref.nbytes
        return buf

    # -- outputs ----------------------------------------------------------------------

    def write(self, outputs, targets: dict[str, TensorRef] | None, reader: str,
              copies: Copies, sync: bool = True) -> list[TensorRef]:
        """Descriptors for (name, datatype, array) outputs, each written once: into its
        target region when the request named one, else inline or into the arena.
        Arrays may be numpy or, from device models, cupy.

        A copy into a client's CUDA region is queued on the device; with `sync` it is
        waited for here, since the response may go out only once the bytes are in the
        client's memory. A batch passes sync=False for each request and waits once,
        before it answers any (`wait_for_device`, on the same thread)."""
        refs = []
        try:
            for name, datatype, array in outputs:
                target = targets.get(name) if targets else None
                if target is not None:
                    refs.append(self._write_region(name, datatype, array, target, copies))
                else:
                    refs.append(self._write_arena(name, datatype, array, reader, copies))
            if sync:
                self.wait_for_device()
        except BaseException:
            self.wait_for_device()  # a failed write leaves no copy in flight
            self.released(reader, arena_blocks(refs))
            raise
        return refs

    def _write_arena(self, name, datatype, array, reader, copies) -> TensorRef:
        shape = list(array.shape)
        if isinstance(array, DeviceView):
            array = array.as_cupy()
        if is_device_array(array):
            n = array.nbytes
            copies.to_host(n)
            if n <= INLINE_MAX:
                return TensorRef(name, datatype, shape, data=array.get().tobytes())
            segment, offset, view = self._alloc(n, reader)
            array.get(out=np.frombuffer(view, dtype=array.dtype).reshape(array.shape))
            return TensorRef(name, datatype, shape, segment=segment, offset=offset, nbytes=n)
        buf = datatypes.tensor_to_buffer(datatype, array)
        n = len(buf) if isinstance(buf, bytes) else buf.nbytes
        if n <= INLINE_MAX:
            return TensorRef(name, datatype, shape, data=bytes(buf))
        segment, offset, view = self._alloc(n, reader)
        view[:] = buf  # the one copy of this output: model memory -> shared memory
        copies.host += n
        return TensorRef(name, datatype, shape, segment=segment, offset=offset, nbytes=n)

    def _write_region(self, name, datatype, array, target: TensorRef, copies) -> TensorRef:
        shape = list(array.shape)
        device = is_device_array(array)
        buf = None if device else datatypes.tensor_to_buffer(datatype, array)
        n = array.nbytes if device else (len(buf) if isinstance(buf, bytes) else buf.nbytes)
        if n > target.nbytes:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"shared memory size specified with the request for output "
                             f"'{name}' ({target.nbytes} bytes) should be at least {n} "
                             "bytes to hold the results")
        if target.device >= 0:
            region = self.regions.cuda(target.region, target.handle, target.device,
                                       target.region_size)
            if isinstance(array, DeviceView):
                # by address: one async copy on this thread's stream, no arrays
                region.check(target.offset, n)
                if n:
                    cp = _cupy()
                    cp.cuda.runtime.memcpyAsync(region.ptr + target.offset, array.ptr, n,
                                                _MEMCPY_DEFAULT,
                                                cp.cuda.get_current_stream().ptr)
                copies.on_device(n)
            elif device:
                # on another GPU than the region, this is the plan's peer copy: cupy
                # copies across devices (memcpyDefault) on this thread's stream
                copy_on_device(region.array(target.offset, n, array.dtype, array.shape),
                               array)
                copies.on_device(n)
            else:
                host = np.frombuffer(buf, dtype=np.uint8)
                region.array(target.offset, n, np.uint8, (n,)).set(host)
                copies.to_device(n)
            self._local.unsynced = True
        else:
            what = f"output '{name}'"
            if isinstance(array, DeviceView):
                array = array.as_cupy()
            if device:
                # into the pinned mapping by DMA where it is pinned, else through a
                # host copy: the CPU never writes a mapping of a client's object
                view = self.regions.dma_view(target.region, target.segment,
                                             target.offset, n, target.region_name, what)
                if view is not None:
                    array.get(out=np.frombuffer(view, dtype=array.dtype).reshape(
                        array.shape))
                    copies.to_host(n)
                else:
                    buf = array.get()
                    copies.to_host(n)
                    self.regions.write(target.region, target.segment, target.offset,
                                       buf, target.region_name, what)
                    copies.host += n
            else:
                self.regions.write(target.region, target.segment, target.offset, buf,
                                   target.region_name, what)
                copies.host += n
        return TensorRef(name, datatype, shape, segment=target.segment, offset=target.offset,
                         nbytes=n, region=target.region, device=target.device)

    def wait_for_device(self) -> None:
        """Wait for the copies into clients' CUDA regions that this thread queued."""
        if getattr(self._local, "unsynced", False):
            self._local.unsynced = False
            from shm.cuda import cupy
            cupy().cuda.get_current_stream().synchronize()

    def _alloc(self, n: int, reader: str):
        with self._lock:
            segment, offset, view = self.arena.alloc(n)
            self._held.setdefault(reader, set()).add((segment, offset))
        return segment, offset, view

    # -- releases ---------------------------------------------------------------------

    def released(self, reader: str, blocks) -> None:
        with self._lock:
            held = self._held.get(reader)
            for segment, offset in blocks:
                self.arena.free(segment, offset)
                if held is not None:
                    held.discard((segment, offset))

    def next_trim(self) -> float | None:
        """Seconds until the arena has an idle segment to give back (Arena.next_trim)."""
        with self._lock:
            return self.arena.next_trim()

    def trim(self) -> None:
        """Give the arena's idle segments back (Arena.trim), between allocations."""
        with self._lock:
            self.arena.trim()

    def forget_reader(self, reader: str) -> None:
        with self._lock:
            for segment, offset in self._held.pop(reader, ()):
                self.arena.free(segment, offset)

    def close(self) -> None:
        self.segments.close()
        self.regions.close()


def _device_dtype(ref: TensorRef):
    """The numpy dtype of a CUDA-region input, checked against its byte size."""
    dtype = datatypes.NUMPY.get(ref.datatype)
    if dtype is None or ref.datatype == "BYTES":
        raise InferError(ErrorCode.INVALID_ARG,
                         f"input '{ref.name}': {ref.datatype} cannot live in CUDA "
                         "shared memory")
    if datatypes.num_elements(ref.shape) * dtype.itemsize != ref.nbytes:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"input '{ref.name}': {ref.nbytes} bytes of CUDA shared "
                         f"memory do not hold a {ref.datatype} tensor of shape "
                         f"{ref.shape}")
    return dtype


def unpinner(unpin):
    """on_unmap/on_release for segments that `pin` registered (None: nothing pinned)."""
    if unpin is None:
        return None
    return lambda view: unpin(address_of(view))


def targets_of(request) -> dict[str, TensorRef] | None:
    """Output name -> the client region the request wants it written into."""
    if not request.outputs:
        return None
    found = {o.name: o.target for o in request.outputs if o.target is not None}
    return found or None

