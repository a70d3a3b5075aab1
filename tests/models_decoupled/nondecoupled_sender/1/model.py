import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            error = ""
            if json.loads(request.parameters()).get("twice"):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
                try:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
                except Exception as exc:
                    error = str(exc)
                # the first response goes out, complete, with this final flag
                sender.send(flags=FINAL)
                continue
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=np.object_))]),
                FINAL)
        return None
