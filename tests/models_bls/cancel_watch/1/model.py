import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.last_wait = "none"
        self.records = 0

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        if mode == "record":
            self.records += 1
        elif mode == "reset":  # forget what the last waiting request saw
            self.last_wait = "none"
        elif mode == "wait":
            marker = json.loads(request.parameters())["marker"]
            open(marker, "w").close()  # the test cancels once it sees this
            deadline = time.monotonic() + 60
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.005)
            self.last_wait = "cancelled" if request.is_cancelled() else "timed out"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "request was cancelled", pb_utils.TritonError.CANCELLED))
        last = f"{self.last_wait} records={self.records}"
        return pb_utils.InferenceResponse(
            [pb_utils.Tensor("LAST", np.array([last.encode()], dtype=object))])
