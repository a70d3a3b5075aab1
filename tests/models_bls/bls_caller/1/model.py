import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            target = params.get("target", "py_identity")
            rest = [t for t in params.get("then", "").split(",") if t]
            forward = {"target": rest[0], "then": ",".join(rest[1:])} if rest else {}
            # the request's own input tensor, passed on as it is (by reference)
            call = pb_utils.InferenceRequest(
                model_name=target, inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                requested_output_names=["OUTPUT0"], parameters=forward)
            response = call.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", out.as_numpy())]))
        return responses
