#!/usr/bin/env python3
"""The host CPU of one CUDA-region request, part by part, in one process with the fake
CUDA runtime (shm/cuda_fake.py): what each role's own code does for it, and apart from
that what the fake costs where a real cupy would run instead. Each part is the least
of many timed repeats (on a loaded machine the mean is mostly other processes' noise),
so the figures are lower bounds of the code's own cost, not of a served request's,
which adds each process's wake-up and socket calls (scripts/bench --profile-role).

    .venv/bin/python scripts/cuda_host_parts.py [--number 1000] [--repeat 41]
        [--elements 1024]
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("SHMSERVE_FAKE_CUDA", "1")

import numpy as np  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from frontend import grpc_codec  # noqa: E402
from scheduler.regions import RegionRegistry  # noqa: E402
from shm import cuda, cuda_fake  # noqa: E402
from shm.messages.frontend import InferRequest, RequestedOutput  # noqa: E402
from shm.messages.regions import CUDA, RegionOp, RegionRequest  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from workers.python_backend import pb_utils  # noqa: E402
from workers.tensors import Copies, DeviceView, TensorIO  # noqa: E402


def wire(n: int, shm: bool) -> bytes:
    """A tritonclient ModelInferRequest: input and output in CUDA regions, or raw."""
    msg = service_pb2.ModelInferRequest(model_name="m", id="42")
    inp = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[n])
    out = msg.outputs.add(name="OUTPUT0")
    if shm:
        for tensor, region in ((inp, "in"), (out, "out")):
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_byte_size"].int64_param = 4 * n
    else:
        msg.raw_input_contents.append(bytes(4 * n))
    return msg.SerializeToString()


def parts(n: int) -> dict[str, object]:
    """name -> a callable doing that part once for one request."""
    cp = cuda.cupy()
    rt = cp.cuda.runtime
    src, dst, mid = rt.malloc(4 * n), rt.malloc(4 * n), rt.malloc(4 * n)
    out: dict[str, object] = {}

    # frontend: the gRPC request's decoding (the rest of its path is the same for both)
    shm_wire, raw_wire = wire(n, True), wire(n, False)
    grpc_codec.decode_infer_request(shm_wire)
    grpc_codec.decode_infer_request(raw_wire)
    out["frontend: gRPC decode, tensors in CUDA regions"] = \
        lambda: grpc_codec.decode_infer_request(shm_wire)
    out["frontend: gRPC decode, raw input (for comparison)"] = \
        lambda: grpc_codec.decode_infer_request(raw_wire)

    # scheduler: the regions' names resolved, the request counted as their user and not
    registry = RegionRegistry(True, 1, lambda region: None, lambda *a: None)
    for name, ptr in (("in", src), ("out", dst)):
        registry.register(RegionRequest(1, "fe", RegionOp.REGISTER, CUDA, name,
                                        byte_size=4 * n, raw_handle=rt.ipcGetMemHandle(ptr)))

    def request():
        return InferRequest(1, "fe", "m", 1,
                            [TensorRef("INPUT0", "FP32", [n], segment="in", nbytes=4 * n,
                                       region=-1)],
                            [RequestedOutput("OUTPUT0", target=TensorRef(
                                "OUTPUT0", "", [], segment="out", nbytes=4 * n,
                                region=-1))])

    def resolve():
        req = request()
        registry.resolve(req)
        registry.finished(req)
        return req

    resolved = resolve()
    out["scheduler: request built (for comparison)"] = request
    out["scheduler: built + regions resolved and released"] = resolve

    # worker: the input by address, the output copied into its region, the batch's wait
    io, copies = TensorIO(None, "w"), Copies()
    ins, target = resolved.inputs[0], resolved.outputs[0].target
    result = DeviceView(mid, (n,), np.dtype(np.float32), 4 * n, 0, None)
    targets = {"OUTPUT0": target}

    def worker():
        io.device_input(ins)
        io.write([("OUTPUT0", "FP32", result)], targets, "fe", copies, sync=False)
        io.wait_for_device()

    out["worker: input view, output copy, batch wait"] = worker

    # the model's DLPack calls, on pb_utils's side (ours) and on cupy's (the fake's)
    tensor = pb_utils.Tensor._from_server_device("INPUT0", "FP32", mid, (n,), 0, None)
    array = cp.from_dlpack(tensor)
    out["model via pb_utils: Tensor.to_dlpack (export)"] = tensor.to_dlpack
    out["model via pb_utils: Tensor.from_dlpack (+ fake export)"] = \
        lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", array.__dlpack__())
    out["fake cupy: from_dlpack (+ pb_utils export)"] = lambda: cp.from_dlpack(tensor)
    out["fake cupy: __dlpack__ (export)"] = array.__dlpack__
    out["fake cupy: copy (the model's kernel: memmove)"] = array.copy
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=1000, help="calls per timed repeat")
    p.add_argument("--repeat", type=int, default=41)
    p.add_argument("--elements", type=int, default=1024, help="FP32 elements a tensor")
    args = p.parse_args(argv)
    table = parts(args.elements)
    worker = table["worker: input view, output copy, batch wait"]
    worker()
    cuda_fake.CALLS.clear()
    worker()
    print(f"CUDA calls per request in the worker part: {dict(sorted(cuda_fake.CALLS.items()))}")
    width = max(map(len, table))
    for name, fn in table.items():
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat))
        print(f"{name:<{width}}  {best / args.number * 1e6:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
