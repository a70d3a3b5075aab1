import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR", "")
        responses = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if marker_dir:
                # holding the input, wait (bounded) until the test has truncated it
                open(os.path.join(marker_dir, "holding"), "w").close()
                go = os.path.join(marker_dir, "go")
                deadline = time.monotonic() + 30
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
                os.unlink(os.path.join(marker_dir, "holding"))
            checksum = int(array[::4096].sum(dtype=np.uint64))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("CHECKSUM", np.array([checksum], dtype=np.uint64))]))
        return responses
