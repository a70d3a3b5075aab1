import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.last = "none"

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0]
            if mode == b"stream":
                self.last = "running"
                threading.Thread(target=self._stream, args=(sender,), daemon=True).start()
            else:
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("LAST", np.array([self.last.encode()], dtype=object))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None  # the stream goes on after execute returned

    def _stream(self, sender):
        deadline = time.monotonic() + 60
        i = 0
        while not sender.is_cancelled() and time.monotonic() < deadline:
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
            i += 1
            time.sleep(0.005)
        self.last = "cancelled" if sender.is_cancelled() else "timed out"
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
