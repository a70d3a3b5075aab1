import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BYTES in, BYTES out: each element upper-cased."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)],
                             dtype=object).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return responses
