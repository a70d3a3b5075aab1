import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with its INPUT0 as OUTPUT0."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x.as_numpy())]))
        return responses
