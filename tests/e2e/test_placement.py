"""Several GPUs on a machine with none: with SHMSERVE_FAKE_GPUS=2 the server places a
python model's KIND_GPU instances over two devices (python instances start without
CUDA), each told its name and device as Triton's python backend tells them, and refuses
a GPU id that is not there. Framework models cannot run on devices that do not exist;
their device workers are covered by tests/unit/test_placement.py."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import ServerProcess, wait_until

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_GPU gpus: {gpus} }} ]
"""

# Each instance leaves a file named `<instance name>@<device id>` holding its kind.
MODEL = """import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        name = args["model_instance_name"] + "@" + args["model_instance_device_id"]
        with open(os.path.join(os.environ["SHMSERVE_TEST_MARKER_DIR"], name), "w") as f:
            f.write(args["model_instance_kind"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


@pytest.fixture(scope="module")
def markers(tmp_path_factory):
    return tmp_path_factory.mktemp("placement-markers")


@pytest.fixture(scope="module")
def server(tmp_path_factory, markers):
    repo = tmp_path_factory.mktemp("placement-models")
    for name, gpus in (("spread", "[0, 1]"), ("missing_gpu", "[0, 2]")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, gpus=gpus))
    srv = ServerProcess([repo], "--exit-on-error=false", "--strict-readiness=false",
                        "--model-control-mode=explicit", "--load-model=spread",
                        log_dir=tmp_path_factory.mktemp("placement-logs"),
                        env={"SHMSERVE_FAKE_GPUS": "2",
                             "SHMSERVE_TEST_MARKER_DIR": str(markers)})
    yield from srv.serve()


def test_count_instances_on_each_gpu_each_told_its_device(server, markers):
    """Rule: `count: 2 kind: KIND_GPU gpus: [0, 1]` starts 4 instances, 2 per GPU,
    named `<group>_<c>` on each device, each told kind GPU and its device id; the
    config read back lists the group as written; the model serves."""
    expected = {f"spread_0_{c}@{d}" for c in (0, 1) for d in (0, 1)}
    wait_until(lambda: {p.name for p in markers.iterdir()} >= expected, 60, 0.1,
               "four instances")
    assert {p.name: p.read_text() for p in markers.iterdir()} == dict.fromkeys(
        expected, "GPU")
    config = client(server, "grpc").get_model_config("spread").config
    group = config.instance_group[0]
    assert (group.name, group.count, list(group.gpus)) == ("spread_0", 2, [0, 1])
    assert config.instance_group[0].kind == 1  # KIND_GPU
    for protocol in PROTOCOLS:
        x = np.arange(4, dtype=np.float32)
        out = client(server, protocol).infer("spread", [infer_input(protocol, "INPUT0", x,
                                                                     "FP32")])
        assert np.array_equal(out.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_gpu_that_is_not_there_fails_the_load(server, protocol):
    """Rule: a group naming GPU 2 on a server with GPUs 0 and 1 fails to load, with
    Triton's message, and the server stays up."""
    c = client(server, protocol)
    with pytest.raises(InferenceServerException, match="failed to load 'missing_gpu'"):
        c.load_model("missing_gpu")
    # the load fails before any instance starts (as on Triton, while polling the
    # repository); its reason goes to the log in Triton's words
    assert ("instance group missing_gpu_0 of model missing_gpu specifies invalid or "
            "unsupported gpu id 2. GPUs with at least the minimum required CUDA compute "
            "compatibility of 6.000000 are: 0, 1") in server.log()
    assert c.is_server_live()
