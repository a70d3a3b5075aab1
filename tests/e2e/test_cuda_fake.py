"""The CUDA shared-memory path end to end on a machine without a GPU: a server run with
SHMSERVE_FAKE_CUDA=1 (shm/cuda_fake.py: host memory behind cupy's calls) serves a
python KIND_GPU model whose input and output lie in the client's CUDA regions, over
both protocols, several requests per region. The model sees device tensors, the bytes
land in the output region, and the server's copy counters show that nothing crossed to
the host (tests/e2e/test_gpu.py checks the same on a real device). One request at a
time, most of them go under a lease: the frontend resolves the regions and sends them
to the worker straight."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import numpy as np
import pytest

from scheduler.bench import cuda as bench_cuda
from shm import cuda_fake
from tests.e2e import clients
from tests.e2e.harness import ServerProcess

pytestmark = pytest.mark.e2e

N = 4096  # FP32 elements per request
ROUNDS = 40  # requests per region and protocol: the first 16 earn a lease

CONFIG = """
name: "fake_gpu"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "IS_CPU" data_type: TYPE_BOOL dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }
"""

MODEL = '''
import cupy as cp
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            x = cp.from_dlpack(tensor)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", x * 2),
                pb_utils.Tensor("IS_CPU", np.array([tensor.is_cpu()]))]))
        return out
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("fake-gpu")
    (repo / "fake_gpu" / "1").mkdir(parents=True)
    (repo / "fake_gpu" / "config.pbtxt").write_text(CONFIG)
    (repo / "fake_gpu" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    logs = tmp_path_factory.mktemp("fake-gpu-logs")
    srv = ServerProcess([repo], "--allow-client-shm=true", "--cuda-sync=block",
                        log_dir=logs,
                        env={"SHMSERVE_FAKE_CUDA": "1",
                             "SHMSERVE_WAKE_COUNTS": str(logs / "wakes.json")})
    srv.counts = logs / "wakes.json"
    srv.start()
    with pytest.MonkeyPatch.context() as mp:  # this process's regions: the fake's too
        fake = cuda_fake.module()
        mp.setitem(sys.modules, "cupy", fake)
        mp.setitem(sys.modules, "cupy.cuda", fake.cuda)
        yield srv
        assert srv.stop() == 0


def _copies(srv) -> dict[str, int]:
    m = re.search(r"model 'fake_gpu' version 1: .*bytes copied host=(\d+) h2d=(\d+) "
                  r"d2h=(\d+) d2d=(\d+)", srv.log())
    assert m, "no copy summary in the log"
    return dict(zip(("host", "h2d", "d2h", "d2d"), map(int, m.groups())))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_cuda_regions_in_and_out(server, protocol):
    client = clients.client(server, protocol)
    mod = clients.module(protocol)
    rounds, nbytes = ROUNDS, 4 * N
    h_in = bench_cuda.create_shared_memory_region(f"in_{protocol}", rounds * nbytes, 0)
    h_out = bench_cuda.create_shared_memory_region(f"out_{protocol}", rounds * nbytes, 0)
    try:
        x = np.arange(rounds * N, dtype=np.float32)
        bench_cuda.set_shared_memory_region(h_in, [x])
        for h in (h_in, h_out):
            client.register_cuda_shared_memory(h.name, bench_cuda.get_raw_handle(h), 0,
                                               rounds * nbytes)
        for i in range(rounds):
            inp = mod.InferInput("INPUT0", [N], "FP32")
            inp.set_shared_memory(h_in.name, nbytes, offset=i * nbytes)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(h_out.name, nbytes, offset=i * nbytes)
            result = client.infer("fake_gpu", [inp],
                                  outputs=[out, clients.requested(protocol, "IS_CPU")])
            assert result.as_numpy("IS_CPU").tolist() == [False]
        got = bench_cuda.get_contents_as_numpy(h_out, np.float32, [rounds * N])
        np.testing.assert_array_equal(got, x * 2)
    finally:
        client.unregister_cuda_shared_memory()
        bench_cuda.destroy_shared_memory_region(h_in)
        bench_cuda.destroy_shared_memory_region(h_out)


def test_nothing_crossed_to_the_host(server):
    # both protocols' rounds (again, if the tests above ran), then the summary the
    # server logs at exit
    for protocol in clients.PROTOCOLS:
        test_cuda_regions_in_and_out(server, protocol)
    assert server.stop() == 0
    copies = _copies(server)
    assert copies["d2h"] == 0 and copies["host"] == 0 and copies["h2d"] == 0, copies
    # every output went region to region: ROUNDS of 4*N bytes per protocol, at least
    assert copies["d2d"] >= 2 * ROUNDS * 4 * N and copies["d2d"] % (4 * N) == 0, copies
    wakes = json.loads(server.counts.read_text())
    # of 2 x 2 x ROUNDS, all but the 16 that earn each lease (an unregister takes it
    # back), less a few where an answer outran its batch's end to the scheduler (the
    # count starts again)
    assert wakes.get("BatchDone under a lease", 0) >= ROUNDS, wakes


def test_workers_wait_for_the_gpu_as_cuda_sync_says(server):
    """--cuda-sync reaches the workers, which set it on each device's primary context
    before any model makes it current (with the fake: the one device, 0)."""
    wait = "--cuda-sync block on GPU(s) [0]"
    assert wait in server.log(), server.log()[-3000:]
