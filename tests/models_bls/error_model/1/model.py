import triton_python_backend_utils as pb_utils

# TRITONSERVER_Error_Code order: CODE indexes this list
NAMES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
         "ALREADY_EXISTS", "CANCELLED"]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"error_model failed with code {code}", getattr(pb_utils.TritonError,
                                                                NAMES[code]))))
        return responses
