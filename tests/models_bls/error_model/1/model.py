import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"error_model failed with code {code}", code)))
        return responses
