"""Decoupled repeater (see config.pbtxt)."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.last_error = ""

    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            if params.get("report"):
                text = np.array([self.last_error.encode()], dtype=np.object_)
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("REPORT", text)]), FINAL)
                continue
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            if params.get("from_thread"):
                t = threading.Thread(target=self.respond, args=(sender, values, params))
                t.start()
                self.threads.append(t)
            else:
                self.respond(sender, values, params)
        return None

    def respond(self, sender, values, params):
        delay = params.get("delay_ms", 0) / 1000.0
        gate = params.get("gate")
        for i, v in enumerate(values):
            if delay:
                time.sleep(delay)
            if gate and i == 1:
                # after the first response, hold the rest until the client has it
                deadline = time.monotonic() + 30
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.005)
            if v == -1:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"element {i} is -1")))
                continue
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([v], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))]))
        sender.send(flags=FINAL)
        if params.get("after_final"):
            try:
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([0], dtype=np.int32))]))
                self.last_error = "no error"
            except Exception as exc:  # what Triton raises in the model
                self.last_error = f"{type(exc).__name__}: {exc}"

    def finalize(self):
        for t in self.threads:
            t.join()
