import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """PARAMS = the request's parameters, as a sorted JSON object."""

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.dumps(json.loads(request.parameters()), sort_keys=True)
            out = np.array([params.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", out)]))
        return responses
