import os
import signal
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

SERVE, RAISE, KILL_SELF, HANG = 0, 1, 2, 3


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
            if marker_dir and (delay >= 1000 or mode == HANG):
                # tests poll for this instead of sleeping
                open(os.path.join(marker_dir, f"running-{os.getpid()}"), "w").close()
            if mode == RAISE:
                raise ValueError("faulty was asked to raise")
            if mode == KILL_SELF:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == HANG:
                threading.Event().wait()  # forever
            time.sleep(delay / 1000.0)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]))
        return responses
