import json

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    """Decoupled fan-out (see config.pbtxt)."""

    def execute(self, requests):
        for request in requests:
            count = json.loads(request.parameters()).get("count", 3)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for k in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + k)]))
            sender.send(flags=FINAL)
        return None
