#!/usr/bin/env python3
"""A python GPU instance answering requests whose input and output lie in a client's
CUDA regions, in one process, with shm/cuda_fake.py in place of cupy (no GPU needed):
the host CPU microseconds per request of what the worker does around the model (input
tensors, the model's DLPack calls, the copy into the output region, the wait once per
batch) and the CUDA calls per request. The fake's own work (memmove for copies, its
Python arrays) is counted too, so the figures are an upper bound for the host side.

    .venv/bin/python scripts/bench_cuda_calls.py [--requests 3000] [--batch 1]
        [--elements 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("SHMSERVE_FAKE_CUDA", "1")

from shm import cuda, cuda_fake  # noqa: E402
from shm.messages.frontend import InferRequest, RequestedOutput  # noqa: E402
from shm.messages.worker import LoadInstance  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from workers.python_backend.runner import PythonInstance  # noqa: E402
from workers.tensors import Copies, TensorIO, targets_of  # noqa: E402

# scripts/gpu_models.py's torch identity, with cupy for torch: a fresh device output
MODEL = textwrap.dedent('''
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack(
                        "OUTPUT0",
                        cp.from_dlpack(pb_utils.get_input_tensor_by_name(r, "INPUT0")).copy())])
                    for r in requests]
''')


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--batch", type=int, default=1, help="requests per execute")
    p.add_argument("--elements", type=int, default=1024, help="FP32 elements a request")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cp = cuda.cupy()
    rt, n = cp.cuda.runtime, args.elements
    src, dst = rt.malloc(4 * n), rt.malloc(4 * n)

    def ref(name, ptr, uid):
        return TensorRef(name, "FP32", [n], nbytes=4 * n, region=uid, device=0,
                         handle=rt.ipcGetMemHandle(ptr), region_size=4 * n,
                         region_name=name)

    ins, outs = ref("INPUT0", src, 1), ref("OUTPUT0", dst, 2)
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "1"))
        with open(os.path.join(tmp, "1", "model.py"), "w") as f:
            f.write(MODEL)
        config = {"name": "m", "backend": "python", "max_batch_size": 0,
                  "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                  "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                  # inputs where the client put them (the default copies them to the host)
                  "parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}}}
        inst = PythonInstance(LoadInstance("i", "m_0", "m", 1, tmp, json.dumps(config).encode(),
                                           kind="KIND_GPU", device_id=0), config)
        io, copies = TensorIO(None, "w"), Copies()
        batch = [InferRequest(i, "fe", "m", 1, [ins],
                              outputs=[RequestedOutput("OUTPUT0", target=outs)])
                 for i in range(args.batch)]
        batches = max(1, args.requests // args.batch)

        def run(count):
            for _ in range(count):  # as workers/main.py's run_batch
                results = inst.execute(batch, io)
                for q, r in zip(batch, results):
                    io.write(r, targets_of(q), q.reply_to, copies, sync=False)
                io.wait_for_device()

        run(50)
        for _ in range(args.rounds):
            cuda_fake.CALLS.clear()
            start = time.process_time()
            run(batches)
            us = (time.process_time() - start) / (batches * args.batch) * 1e6
            calls = {k: round(v / (batches * args.batch), 2)
                     for k, v in sorted(cuda_fake.CALLS.items())}
            print(f"{us:7.1f} us CPU per request; calls per request {calls}")
        inst.finalize()
        io.close()
    rt.free(src)
    rt.free(dst)


if __name__ == "__main__":
    main()
