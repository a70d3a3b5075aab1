import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            calls = [pb_utils.InferenceRequest(model_name=name, inputs=[x],
                                               requested_output_names=["OUTPUT0"])
                     for name in ("py_identity", "onnx_identity")]
            results = await asyncio.gather(*(c.async_exec() for c in calls))
            errors = [r.error() for r in results if r.has_error()]
            if errors:
                responses.append(pb_utils.InferenceResponse(error=errors[0]))
                continue
            total = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                        for r in results)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
