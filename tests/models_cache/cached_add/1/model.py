"""OUTPUT0 = INPUT0 + 1, OUTPUT1 = INPUT0 * 2; appends one line per executed request to
$SHMSERVE_TEST_MARKER_DIR/<model>.executions, so tests count real executions
independently of the server's statistics."""

import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x + 1),
                pb_utils.Tensor("OUTPUT1", x * 2)]))
        marker_dir = os.environ.get("SHMSERVE_TEST_MARKER_DIR")
        if marker_dir:
            with open(os.path.join(marker_dir, f"{self.name}.executions"), "a") as f:
                f.write("x\n" * len(requests))
        return responses
