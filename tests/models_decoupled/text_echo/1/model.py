import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = text.reshape(-1)[0].decode().split()
            suffix = json.loads(request.parameters()).get("suffix", "")
            for i, word in enumerate(words):
                out = np.array([(word + suffix).encode()], dtype=np.object_)
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("text_output", out)], parameters={"index": i}))
            sender.send(flags=FINAL)
        return None
