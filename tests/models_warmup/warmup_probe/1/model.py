"""Identity on INPUT0 that records each call: with $WARMUP_PROBE_DIR set, every
instance appends one JSON line per initialize() and execute() to
$WARMUP_PROBE_DIR/<instance name>.jsonl (each request's inputs: shape and values)."""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.environ.get("WARMUP_PROBE_DIR")
        self.path = (os.path.join(folder, args["model_instance_name"] + ".jsonl")
                     if folder else None)
        self._record({"event": "initialize"})

    def _record(self, entry):
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def execute(self, requests):
        seen, responses = [], []
        for request in requests:
            inputs = {}
            for tensor in request.inputs():
                array = tensor.as_numpy()
                values = array.tolist()
                if array.dtype == object:
                    values = [v.decode() for v in array.reshape(-1).tolist()]
                inputs[tensor.name()] = {"shape": list(array.shape), "values": values}
            seen.append(inputs)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        self._record({"event": "execute", "requests": seen})
        return responses
