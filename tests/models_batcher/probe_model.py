"""A python model that reports how the server ran it, for the batcher rule tests.

The tests copy this file in as `<model>/1/model.py` beside configs they write (see
tests/e2e/test_batcher_rules.py). Each response carries:
  OUTPUT0   the request's INPUT0, unchanged (so a mixed-up response shows);
  CALL      which execute() call of this instance ran it (1, 2, ...);
  IN_CALL   how many requests that call held;
  INSTANCE  args["model_instance_name"], Triton's name for the instance;
  SPAN      wall-clock start and end of the call (time.time()).
An execute() call sleeps EXECUTE_DELAY_MS (a config parameter), plus INPUT0's first
value in milliseconds when DELAY_FROM_INPUT is "1". With SHMSERVE_TEST_MARKER_DIR set,
it writes `started-<instance>-<call>` there as it starts, so tests wait on a file
instead of a sleep.
"""

import json
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        params = json.loads(args["model_config"]).get("parameters", {})

        def param(key, default):
            return params.get(key, {}).get("string_value", default)

        self.delay_s = float(param("EXECUTE_DELAY_MS", "0")) / 1e3
        self.from_input = param("DELAY_FROM_INPUT", "0") == "1"
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        start = time.time()
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
        if marker_dir:
            open(os.path.join(marker_dir, f"started-{self.instance}-{self.calls}"), "w").close()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        delay = self.delay_s
        if self.from_input:
            delay += max(float(x.flat[0]) for x in inputs if x.size) / 1e3
        time.sleep(delay)
        end = time.time()
        responses = []
        for x in inputs:
            rows = x.shape[0] if x.ndim > 1 else 1
            shape = (rows, 1) if x.ndim > 1 else (1,)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("CALL", np.full(shape, self.calls, dtype=np.int64)),
                pb_utils.Tensor("IN_CALL", np.full(shape, len(requests), dtype=np.int64)),
                pb_utils.Tensor("INSTANCE", np.full(shape, self.instance.encode(),
                                                    dtype=np.object_)),
                pb_utils.Tensor("SPAN", np.tile(np.array([start, end]), shape[:-1] + (1,))
                                if x.ndim > 1 else np.array([start, end])),
            ]))
        return responses
