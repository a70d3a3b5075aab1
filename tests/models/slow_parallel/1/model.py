import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            start = time.time()
            marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
            if marker_dir and delay >= 1000:  # tests poll for this instead of sleeping
                open(os.path.join(marker_dir, f"running-{os.getpid()}"), "w").close()
            time.sleep(delay / 1000.0)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("SPAN", np.array([start, time.time()], dtype=np.float64)),
            ]))
        return responses

    def finalize(self):
        # Tests that check finalize() runs at shutdown point this at a folder.
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
        if marker_dir:
            with open(os.path.join(marker_dir, f"finalized-{self.instance}"), "w") as f:
                f.write(str(os.getpid()))
