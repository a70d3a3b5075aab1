import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = None

    async def execute(self, requests):
        if self.gate is None:  # made on the loop execute runs on
            self.gate = asyncio.Event()
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0]
            if mode == b"wait":
                await asyncio.wait_for(self.gate.wait(), 60)
            elif mode == b"open":
                self.gate.set()
            else:
                raise ValueError(f"unknown mode {mode!r}")
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
