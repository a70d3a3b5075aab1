import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(params.get("EXECUTE_DELAY_MS", {}).get("string_value", 0)) / 1e3

    def execute(self, requests):
        time.sleep(self.delay_s)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.size and x.flat[0] <= -2:  # a failure Triton counts (an error response
                raise pb_utils.TritonModelException("execute failed")  # is a success)
            if x.size and x.flat[0] < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
