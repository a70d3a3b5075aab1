"""OUTPUT0 = INPUT0 * the config's `scale`: which config served a request shows in its
answer. `delay_ms` slows each execution, `init_delay_ms` initialize; `fail_init: "1"` refuses
to initialize."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config: dict, key: str, default: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if _param(config, "fail_init", "0") == "1":
            raise RuntimeError("initialize refused: fail_init is set")
        self.scale = float(_param(config, "scale", "1"))
        self.delay = float(_param(config, "delay_ms", "0")) / 1000
        # a test that checks loads serialise records when each initialize ran
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
        start = time.monotonic()
        time.sleep(float(_param(config, "init_delay_ms", "0")) / 1000)
        if marker_dir:
            with open(os.path.join(marker_dir, f"{args['model_name']}-init.log"), "a") as f:
                f.write(f"{self.scale} {start} {time.monotonic()}\n")

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = (x * self.scale).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
