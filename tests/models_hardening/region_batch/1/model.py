import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                  for r in requests]
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR", "")
        arm = os.path.join(marker_dir, "arm")
        if marker_dir and os.path.exists(arm):
            # the batch a test holds (bounded): it shrinks a client's object meanwhile
            os.unlink(arm)
            open(os.path.join(marker_dir, "holding"), "w").close()
            go = os.path.join(marker_dir, "go")
            deadline = time.monotonic() + 30
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.unlink(os.path.join(marker_dir, "holding"))
        else:
            time.sleep(0.005)  # the inputs held while "computing"
        responses = []
        for x in inputs:
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x + np.float32(1)),  # reads every input byte
                pb_utils.Tensor("REQUESTS_IN_CALL",
                                np.full((rows, 1), len(requests), np.int32)),
                pb_utils.Tensor("PID", np.full((rows, 1), os.getpid(), np.int64)),
            ]))
        return responses
