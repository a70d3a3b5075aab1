import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            # tests see that a request is running (not queued) by its marker file
            marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
            if marker_dir and request.request_id():
                path = os.path.join(marker_dir, "started-" + request.request_id())
                open(path, "w").close()
            delay = json.loads(request.parameters()).get("delay_ms", 0)
            time.sleep(delay / 1000.0)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
