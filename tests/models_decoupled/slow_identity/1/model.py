import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            delay = json.loads(request.parameters()).get("delay_ms", 0)
            time.sleep(delay / 1000.0)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
