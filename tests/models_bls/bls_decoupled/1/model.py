import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="py_repeat", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            values, count = [], 0
            for response in call.exec(decoupled=True):
                count += 1
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.extend(out.as_numpy().tolist())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(values, dtype=np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32))]))
        return responses
