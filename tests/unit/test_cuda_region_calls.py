"""What a request whose tensors lie in a client's CUDA regions costs a python GPU
instance in CUDA calls, with the host-memory fake of shm/cuda_fake.py in place of cupy
(no GPU needed): the IPC handle is opened once per region (again after the region is
forgotten and registered anew), the stream is synchronized once per batch, each output
is one async copy, and the server adds no DLPack export or import of its own to what the
model does. The batch is answered as workers/main.py's run_batch answers one: outputs
written without a sync, then one wait."""

import json
import sys
import textwrap

import numpy as np
import pytest

from shm import cuda_fake
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.worker import LoadInstance
from shm.tensor import TensorRef
from workers.python_backend.runner import PythonInstance
from workers.tensors import Copies, TensorIO, targets_of

N = 256  # FP32 elements per request

# The model's own DLPack traffic, per request: cp.from_dlpack(tensor) is one export (by
# pb_utils) and one import (by cupy); Tensor.from_dlpack(..., y) the reverse.
MODEL = textwrap.dedent('''
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = cp.from_dlpack(pb_utils.get_input_tensor_by_name(r, "INPUT0"))
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor.from_dlpack("OUTPUT0", x * 2)]))
            return out
''')


@pytest.fixture
def cp(monkeypatch):
    fake = cuda_fake.module()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake.cuda)
    cuda_fake.CALLS.clear()
    return fake


@pytest.fixture
def gpu_instance(tmp_path, cp):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(MODEL)
    config = {"name": "m", "backend": "python", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}}}
    msg = LoadInstance("i0", "m_0", "m", 1, str(tmp_path), json.dumps(config).encode(),
                       kind="KIND_GPU", device_id=0)
    inst = PythonInstance(msg, config)
    yield inst
    inst.finalize()


class Region:
    """A client's CUDA region (fake device memory) and the refs requests make to it."""

    def __init__(self, cp, uid: int, nbytes: int):
        rt = cp.cuda.runtime
        self.rt, self.uid, self.nbytes = rt, uid, nbytes
        self.ptr = rt.malloc(nbytes)
        self.handle = rt.ipcGetMemHandle(self.ptr)

    def ref(self, name: str, offset: int, n: int) -> TensorRef:
        return TensorRef(name, "FP32", [n], offset=offset, nbytes=4 * n, region=self.uid,
                         device=0, handle=self.handle, region_size=self.nbytes,
                         region_name=f"r{self.uid}")

    def put(self, offset: int, values: np.ndarray) -> None:
        self.rt.memcpy(self.ptr + offset, values.ctypes.data, values.nbytes, 4)

    def get(self, offset: int, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        self.rt.memcpy(out.ctypes.data, self.ptr + offset, out.nbytes, 4)
        return out

    def free(self) -> None:
        self.rt.free(self.ptr)


def run_batch(inst, io, requests, copies):
    """As workers/main.py's run_batch: every output written unsynced, then one wait."""
    results = inst.execute(requests, io)
    refs = [io.write(r, targets_of(q), q.reply_to, copies, sync=False)
            for q, r in zip(requests, results)]
    io.wait_for_device()
    return refs


def requests(src: Region, dst: Region, first: int, count: int) -> list[InferRequest]:
    return [InferRequest(i, "fe", "m", 1, [src.ref("INPUT0", 4 * N * i, N)],
                         outputs=[RequestedOutput("OUTPUT0",
                                                  target=dst.ref("OUTPUT0", 4 * N * i, N))])
            for i in range(first, first + count)]


def test_calls_are_per_region_and_per_batch_not_per_request(gpu_instance, cp):
    batches, per_batch = 5, 4
    n_req = batches * per_batch
    src, dst = Region(cp, 1, 4 * N * n_req), Region(cp, 2, 4 * N * n_req)
    try:
        x = np.arange(N * n_req, dtype=np.float32)
        src.put(0, x)
        io, copies = TensorIO(None, "w"), Copies()
        cuda_fake.CALLS.clear()
        for b in range(batches):
            refs = run_batch(gpu_instance, io, requests(src, dst, b * per_batch, per_batch),
                             copies)
            assert all(r[0].region == 2 and r[0].device == 0 for r in refs)
        np.testing.assert_array_equal(dst.get(0, N * n_req), x * 2)
        calls = cuda_fake.CALLS
        assert calls["ipcOpenMemHandle"] == 2  # one per region, not per request
        assert calls["stream_synchronize"] == batches  # one per batch
        assert calls["memcpy_async"] == n_req  # one copy per output
        assert calls["stream_create"] == calls["event_create"] == 0
        # the model's own one export and one import per request, and nothing more
        assert calls["dlpack_export"] == calls["dlpack_import"] == n_req, dict(calls)
        assert (copies.d2d_ops, copies.h2d_ops, copies.d2h_ops) == (n_req, 0, 0)

        # unregistered: closed once; registered again (a new uid): opened anew
        io.regions.forget(1)
        assert calls["ipcCloseMemHandle"] == 1
        again = Region.__new__(Region)
        again.__dict__.update(src.__dict__, uid=3)
        run_batch(gpu_instance, io, requests(again, dst, 0, per_batch), copies)
        assert calls["ipcOpenMemHandle"] == 3
        io.close()
        assert calls["ipcCloseMemHandle"] == 3
    finally:
        src.free()
        dst.free()


def test_device_output_into_arena_and_out_of_bounds_target(gpu_instance, cp):
    """A device output the client wants back in the response (not in a region) comes
    to the host once; a target region too small for it is refused, as before."""
    src, dst = Region(cp, 1, 4 * N), Region(cp, 2, 4 * N)
    try:
        x = np.arange(N, dtype=np.float32)
        src.put(0, x)
        io, copies = TensorIO(None, "w"), Copies()
        req = InferRequest(0, "fe", "m", 1, [src.ref("INPUT0", 0, N)])
        [(name, datatype, array)] = gpu_instance.execute([req], io)[0]
        [ref] = io.write([(name, datatype, array)], None, "fe", copies)
        assert ref.data is not None  # small: inline
        np.testing.assert_array_equal(np.frombuffer(ref.data, np.float32), x * 2)
        assert copies.d2h_ops == 1

        small = dst.ref("OUTPUT0", 0, N // 2)
        with pytest.raises(Exception, match="should be at least"):
            io.write([(name, datatype, array)], {"OUTPUT0": small}, "fe", copies)
        io.close()
    finally:
        src.free()
        dst.free()


def test_a_name_registered_again_with_another_handle_never_reaches_the_old_memory(cp):
    """The registry gives a registration of an old name a new uid and the new handle,
    and a worker opens regions by uid: a region unregistered and registered again under
    the same name over other memory is opened anew, even while the worker still holds
    the old one open (its RegionGone not read yet), so an output lands in the new
    allocation and the old one is left alone."""
    from scheduler.regions import RegionRegistry
    from shm.messages.regions import CUDA, RegionOp, RegionRequest

    registry = RegionRegistry(True, 1, lambda region: None, lambda *a: None)
    old, new = Region(cp, 0, 4 * N), Region(cp, 0, 4 * N)
    io, copies = TensorIO(None, "w"), Copies()
    try:
        def resolved(region: Region) -> TensorRef:
            registry.register(RegionRequest(1, "fe", RegionOp.REGISTER, CUDA, "out",
                                            byte_size=region.nbytes,
                                            raw_handle=region.handle))
            req = InferRequest(1, "fe", "m", 1, [], outputs=[RequestedOutput(
                "OUTPUT0", target=TensorRef("OUTPUT0", "", [], segment="out",
                                            nbytes=4 * N, region=-1))])
            registry.resolve(req)
            registry.finished(req)
            registry.unregister(CUDA, "out", lambda: None)
            return req.outputs[0].target

        def write(target: TensorRef, value: float) -> None:
            out = np.full(N, value, np.float32)
            io.write([("OUTPUT0", "FP32", out)], {"OUTPUT0": target}, "fe", copies)

        first = resolved(old)
        write(first, 1.0)
        second = resolved(new)  # same name, other memory; the worker forgot nothing
        assert second.region != first.region and second.handle == new.handle
        write(second, 2.0)
        assert (old.get(0, N) == 1.0).all() and (new.get(0, N) == 2.0).all()
        assert cuda_fake.CALLS["ipcOpenMemHandle"] == 2
    finally:
        io.close()
        old.free()
        new.free()
