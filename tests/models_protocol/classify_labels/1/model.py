import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SCORES and PLAIN both carry INPUT0."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SCORES", x), pb_utils.Tensor("PLAIN", x.copy())]))
        return responses
