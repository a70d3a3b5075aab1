"""A python accumulator with implicit state, for the sequence batcher tests.

The tests copy this file in as `<model>/1/model.py` (tests/models_sequence/repo.py).
Per request it adds INPUT to the state ACC_IN (handed over by the server, zero at
START) and returns the sum as OUTPUT and as the new state ACC_OUT. READY false marks a
filler row: it answers zeros and leaves its state alone. Each response also shows how
the server ran the batch it was in:
  START_VEC, READY_VEC  the START and READY control of every row of that execute() call
  CORRID_OUT            the correlation id the CORRID control carried (as text)
  CALL                  which execute() call of this instance ran it (1, 2, ...)
"""

import numpy as np

import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return 0 if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        starts = np.array([[_flag(r, "START") for r in requests]], dtype=np.int32)
        readies = np.array([[_flag(r, "READY") for r in requests]], dtype=np.int32)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            value = corrid.reshape(-1)[0]
            text = value.decode() if isinstance(value, bytes) else str(int(value))
            if _flag(request, "READY"):
                total = (acc + x).astype(np.int32)
            else:  # a filler: nothing real to add, and its state is not kept
                total = np.zeros_like(acc)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("ACC_OUT", total),
                pb_utils.Tensor("START_VEC", starts),
                pb_utils.Tensor("READY_VEC", readies),
                pb_utils.Tensor("CORRID_OUT", np.array([[text]], dtype=np.object_)),
                pb_utils.Tensor("CALL", np.array([[self.calls]], dtype=np.int64)),
            ]))
        return responses
