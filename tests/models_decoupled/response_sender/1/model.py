import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(index, n):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("INDEX", np.array([[index]], dtype=np.int32)),
        pb_utils.Tensor("N", np.array([[n]], dtype=np.int32))])


def _send(sender, how_many, offset, final, n):
    for i in range(how_many):
        sender.send(_response(offset + i, n))
    if final:
        sender.send(flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        returned, later = [], []
        for request in requests:
            p = json.loads(request.parameters())
            sender = None
            if p.get("pre") or p.get("post") or p.get("pre_final") or p.get("post_final"):
                sender = request.get_response_sender()
            # a second response raises here, uncaught, as in Triton's qa model
            _send(sender, p.get("pre", 0), 1000, p.get("pre_final"), n)
            returned.append(_response(0, n) if p.get("ret") else None)
            later.append((sender, p.get("post", 0), p.get("post_final")))

        def after():
            for sender, how_many, final in later:
                try:
                    _send(sender, how_many, 2000, final, n)
                except pb_utils.TritonModelException as exc:
                    # a sender closed by the returned response: logged, as Triton's
                    # stub cannot catch it either
                    pb_utils.Logger.log_info(f"response_sender after return: {exc}")

        threading.Thread(target=after, daemon=True).start()
        return None if returned == [None] * n else returned
