import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils


def _call(x):
    request = pb_utils.InferenceRequest(
        model_name="py_identity", inputs=[pb_utils.Tensor("INPUT0", x)],
        requested_output_names=["OUTPUT0"])
    return request


def _output(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.pool = ThreadPoolExecutor(2)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            main = threading.current_thread() is threading.main_thread()
            futures = [self.pool.submit(lambda: _output(_call(x).exec())) for _ in range(2)]
            total = sum(f.result() for f in futures)

            async def one():
                return _output(await _call(x).async_exec())

            total = total + asyncio.run(one())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", total.astype(np.float32)),
                pb_utils.Tensor("MAIN", np.array([int(main)], dtype=np.int32))]))
        return responses

    def finalize(self):
        self.pool.shutdown()
