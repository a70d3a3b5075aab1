import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request once, then closes it."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
