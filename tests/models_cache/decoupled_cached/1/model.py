import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(
                request, "IN")]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
