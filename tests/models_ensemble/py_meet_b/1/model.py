import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, but only if the peer model (config parameter "peer") runs the
    same request at the same time: each leaves a marker for the request (named by the
    first input value) and waits, up to 10 s, for the other's. A test synchronises on
    this instead of timing two steps."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.peer = config["parameters"]["peer"]["string_value"]
        self.dir = os.environ["SHMSERVE_TEST_MARKER_DIR"]

    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            token = int(x.flat[0])
            open(os.path.join(self.dir, f"meet-{self.name}-{token}"), "w").close()
            peer = os.path.join(self.dir, f"meet-{self.peer}-{token}")
            deadline = time.monotonic() + 10
            while not os.path.exists(peer) and time.monotonic() < deadline:
                time.sleep(0.005)
            if os.path.exists(peer):
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            else:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"{self.name} ran request {token} without {self.peer}")))
        return responses
