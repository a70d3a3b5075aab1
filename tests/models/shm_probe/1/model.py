import numpy as np

import triton_python_backend_utils as pb_utils


def mapping_of(address: int) -> str:
    """The path of the mapping in /proc/self/maps that holds `address` ("" if anonymous)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    return "?"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            where = mapping_of(array.__array_interface__["data"][0])
            # every 4096th byte: reads the input without copying it
            checksum = int(array[::4096].sum(dtype=np.uint64))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("MAPPING", np.array([where.encode()], dtype=object)),
                pb_utils.Tensor("CHECKSUM", np.array([checksum], dtype=np.uint64)),
            ]))
        return responses
