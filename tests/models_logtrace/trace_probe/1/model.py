import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            # one line per level, each naming the request, so a test can tell which
            # levels reached the log file
            pb_utils.Logger.log_verbose(f"probe verbose line for {r.request_id()}")
            pb_utils.Logger.log_info(f"probe info line for {r.request_id()}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]))
        return responses
