"""frontend.validate: every Triton request check, with Triton's wording."""

import struct

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from frontend.types import DecodedInput, DecodedRequest, RequestedOutput
from frontend.validate import dims_str, validate_request
from shm.datatypes import serialize_bytes
from shm.errors import ErrorCode, InferError


def config(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


BATCHED = config("""
name: "m" backend: "python" max_batch_size: 8
input [
  {name: "INPUT0" data_type: TYPE_FP32 dims: [16]},
  {name: "INPUT1" data_type: TYPE_INT32 dims: [-1, 2]}
]
output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [16]}]
""")

PLAIN = config("""
name: "p" backend: "python"
input [{name: "X" data_type: TYPE_FP32 dims: [2, 3]}]
output [{name: "Y" data_type: TYPE_FP32 dims: [2, 3]}]
""")

OPTIONAL = config("""
name: "o" backend: "python" max_batch_size: 4
input [
  {name: "INPUT0" data_type: TYPE_FP32 dims: [1]},
  {name: "INPUT1" data_type: TYPE_FP32 dims: [1]},
  {name: "INPUT2" data_type: TYPE_FP32 dims: [1]},
  {name: "INPUT3" data_type: TYPE_FP32 dims: [1] optional: true}
]
output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [1]}]
""")

STRINGS = config("""
name: "s" backend: "python" max_batch_size: 2
input [{name: "TEXT" data_type: TYPE_STRING dims: [3]}]
output [{name: "OUT" data_type: TYPE_STRING dims: [3]}]
""")

SHAPE_TENSOR = config("""
name: "st" backend: "python" max_batch_size: 4
input [
  {name: "DATA" data_type: TYPE_FP32 dims: [4]},
  {name: "SHAPE" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true}
]
output [{name: "OUT" data_type: TYPE_FP32 dims: [4]}]
""")


def tensor(name, array, datatype=None):
    array = np.asarray(array)
    datatype = datatype or {np.float32: "FP32", np.int32: "INT32"}[array.dtype.type]
    return DecodedInput(name, datatype, list(array.shape), array.tobytes())


def request(inputs, outputs=None, id="", model="m"):
    return DecodedRequest(model, "", id, inputs, outputs, {})


def good_batched(batch=2):
    return [tensor("INPUT0", np.zeros((batch, 16), np.float32)),
            tensor("INPUT1", np.zeros((batch, 5, 2), np.int32))]


def error_of(req, cfg) -> str:
    with pytest.raises(InferError) as info:
        validate_request(req, cfg)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


def test_valid_request_returns_batch_size():
    assert validate_request(request(good_batched(3)), BATCHED) == 3
    assert validate_request(request([tensor("X", np.zeros((2, 3), np.float32))],
                                    model="p"), PLAIN) == 0


def test_requested_outputs_must_exist():
    outs = [RequestedOutput("OUTPUT0"), RequestedOutput("NOPE")]
    assert error_of(request(good_batched(), outs), BATCHED) == (
        "unexpected inference output 'NOPE' for model 'm'")


def test_request_id_prefix():
    msg = error_of(request(good_batched(9), id="abc"), BATCHED)
    assert msg.startswith("[request id: abc] ")


def test_missing_inputs_all_required():
    msg = error_of(request([tensor("INPUT0", np.zeros((1, 1), np.float32))], model="o"),
                   OPTIONAL)
    assert msg == (
        "[request id: <id_unknown>] expected number of inputs between 3 and 4 but got 1 "
        "inputs for model 'o'. Got input(s) ['INPUT0'], but missing required input(s) "
        "['INPUT1','INPUT2']. Please provide all required input(s).")
    msg = error_of(request([tensor("INPUT0", np.zeros((1, 16), np.float32))]), BATCHED)
    assert msg == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'm'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please "
        "provide all required input(s).")
    assert "Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']" in (
        error_of(request([]), BATCHED))


def test_too_many_inputs():
    inputs = good_batched() + [tensor("EXTRA", np.zeros((2, 1), np.float32))]
    assert "expected 2 inputs but got 3 inputs for model 'm'" in error_of(
        request(inputs), BATCHED)


def test_optional_input_may_be_absent():
    inputs = [tensor(f"INPUT{i}", np.zeros((1, 1), np.float32)) for i in range(3)]
    assert validate_request(request(inputs, model="o"), OPTIONAL) == 1
    inputs.append(tensor("INPUT3", np.zeros((1, 1), np.float32)))
    assert validate_request(request(inputs, model="o"), OPTIONAL) == 1


def test_unexpected_input():
    inputs = [good_batched()[0], tensor("BOGUS", np.zeros((2, 5, 2), np.int32))]
    assert error_of(request(inputs), BATCHED) == (
        "unexpected inference input 'BOGUS' for model 'm'")
    inputs = [tensor(f"INPUT{i}", np.zeros((1, 1), np.float32)) for i in range(3)]
    inputs.append(tensor("BOGUS", np.zeros((1, 1), np.float32)))
    assert error_of(request(inputs, model="o"), OPTIONAL) == (
        "unexpected inference input 'BOGUS' for model 'o'")


def test_optional_input_cannot_stand_in_for_a_required_one():
    inputs = [tensor(n, np.zeros((1, 1), np.float32))
              for n in ("INPUT0", "INPUT1", "INPUT3")]
    assert "missing required input(s) ['INPUT2']" in error_of(
        request(inputs, model="o"), OPTIONAL)


def test_duplicate_input():
    inputs = good_batched() + [good_batched()[0]]
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] input 'INPUT0' already exists in request")


def test_batch_dimension_required_and_shared():
    inputs = good_batched()
    inputs[0] = DecodedInput("INPUT0", "FP32", [], b"")
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] input 'INPUT0' has no shape but model requires "
        "batch dimension for 'm'")
    inputs = [tensor("INPUT0", np.zeros((2, 16), np.float32)),
              tensor("INPUT1", np.zeros((3, 5, 2), np.int32))]
    # Triton walks the inputs last first (its hash map's order): INPUT1's batch of 3
    # stands, INPUT0 is the odd one (checked on 2.51: batch_sizes_differ)
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] input 'INPUT0' batch size does not match other "
        "inputs for 'm'")


def test_batch_larger_than_max_batch_size():
    assert error_of(request(good_batched(9)), BATCHED) == (
        "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'm'")


def test_datatype_mismatch():
    inputs = good_batched()
    inputs[0] = tensor("INPUT0", np.zeros((2, 16), np.int32))
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but "
        "model 'm' expects 'FP32'")


def test_shape_mismatch_batched_has_note():
    inputs = good_batched(1)
    inputs[0] = tensor("INPUT0", np.zeros((1, 17), np.float32))
    msg = error_of(request(inputs), BATCHED)
    assert msg.startswith(
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'm'. "
        "Expected [-1,16], got [1,17]. NOTE: Setting a non-zero max_batch_size")
    inputs[0] = tensor("INPUT0", np.zeros((1, 16, 1), np.float32))
    assert "Expected [-1,16], got [1,16,1]." in error_of(request(inputs), BATCHED)


def test_shape_mismatch_unbatched():
    req = request([tensor("X", np.zeros((3, 2), np.float32))], model="p")
    assert error_of(req, PLAIN) == (
        "[request id: <id_unknown>] unexpected shape for input 'X' for model 'p'. "
        "Expected [2,3], got [3,2]. ")  # Triton 2.51 ends it with a space


def test_wildcard_dims_accept_any_size():
    inputs = good_batched()
    inputs[1] = tensor("INPUT1", np.zeros((2, 7, 2), np.int32))
    assert validate_request(request(inputs), BATCHED) == 2
    inputs[1] = tensor("INPUT1", np.zeros((2, 7, 3), np.int32))
    assert "Expected [-1,-1,2], got [2,7,3]." in error_of(request(inputs), BATCHED)


def test_unspecified_dimension_in_request():
    inputs = good_batched()
    inputs[1] = DecodedInput("INPUT1", "INT32", [2, -1, 2], b"")
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] All input dimensions should be specified for input "
        "'INPUT1' for model 'm', got [2,-1,2]")


def test_byte_size_mismatch():
    inputs = good_batched()
    inputs[0] = DecodedInput("INPUT0", "FP32", [2, 16], memoryview(bytes(120)))
    assert error_of(request(inputs), BATCHED) == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for "
        "model 'm'. Expected 128, got 120")


def assert_invalid(req, cfg, message):
    assert error_of(req, cfg) == "[request id: <id_unknown>] " + message


def shm_input(name, datatype, shape, **params):
    return DecodedInput(name, datatype, shape, None, {"shared_memory_region": "r", **params})


def test_shared_memory_input_size_is_its_byte_size():
    inputs = good_batched()
    inputs[0] = shm_input("INPUT0", "FP32", [2, 16], shared_memory_byte_size=128,
                          shared_memory_offset=64)
    assert validate_request(request(inputs), BATCHED) == 2
    inputs[0] = shm_input("INPUT0", "FP32", [2, 16], shared_memory_byte_size=4)
    assert_invalid(request(inputs), BATCHED,
                   "input byte size mismatch for input 'INPUT0' for model 'm'. "
                   "Expected 128, got 4")


def test_shared_memory_input_needs_a_byte_size():
    inputs = good_batched()
    inputs[0] = shm_input("INPUT0", "FP32", [2, 16])
    assert_invalid(request(inputs), BATCHED,
                   "'shared_memory_byte_size' must be specified along with "
                   "'shared_memory_region' parameter for tensor 'INPUT0'")


@pytest.mark.parametrize("key,value", [
    ("shared_memory_byte_size", -128), ("shared_memory_offset", -1),
    ("shared_memory_offset", "0"), ("shared_memory_byte_size", True),
])
def test_shared_memory_bad_numbers(key, value):
    inputs = good_batched()
    inputs[0] = shm_input("INPUT0", "FP32", [2, 16], **{"shared_memory_byte_size": 128,
                                                       key: value})
    assert_invalid(request(inputs), BATCHED,
                   f"invalid value for '{key}' parameter for tensor 'INPUT0': expected "
                   f"a non-negative integer, got {value!r}")


def test_shared_memory_bytes_input_size_is_not_checked():
    # the length prefixes are in the region; Triton does not read them either
    req = request([shm_input("TEXT", "BYTES", [1, 3], shared_memory_byte_size=5)],
                  model="s")
    assert validate_request(req, STRINGS) == 1


def test_input_without_data_or_region():
    inputs = good_batched()
    inputs[0] = DecodedInput("INPUT0", "FP32", [2, 16], None)
    assert_invalid(request(inputs), BATCHED,
                   "unable to find data for input tensor 'INPUT0' for model 'm' in "
                   "request.")


def test_shared_memory_outputs():
    ok = RequestedOutput("OUTPUT0", parameters={"shared_memory_region": "o",
                                                "shared_memory_byte_size": 128})
    assert validate_request(request(good_batched(), outputs=[ok]), BATCHED) == 2
    missing = RequestedOutput("OUTPUT0", parameters={"shared_memory_region": "o"})
    assert_invalid(request(good_batched(), outputs=[missing]), BATCHED,
                   "'shared_memory_byte_size' must be specified along with "
                   "'shared_memory_region' parameter for tensor 'OUTPUT0'")
    negative = RequestedOutput("OUTPUT0", parameters={
        "shared_memory_region": "o", "shared_memory_byte_size": 8,
        "shared_memory_offset": -8})
    assert_invalid(request(good_batched(), outputs=[negative]), BATCHED,
                   "invalid value for 'shared_memory_offset' parameter for tensor "
                   "'OUTPUT0': expected a non-negative integer, got -8")


def test_shape_tensor_keeps_its_shape():
    inputs = [tensor("DATA", np.zeros((3, 4), np.float32)),
              tensor("SHAPE", np.zeros(2, np.int32))]
    assert validate_request(request(inputs, model="st"), SHAPE_TENSOR) == 3


def strings(values):
    return serialize_bytes(np.array(values, dtype=object))


def test_bytes_input_valid():
    req = request([DecodedInput("TEXT", "BYTES", [1, 3], strings([b"a", b"", b"ccc"]))],
                  model="s")
    assert validate_request(req, STRINGS) == 1


def test_bytes_input_too_few_elements():
    req = request([DecodedInput("TEXT", "BYTES", [1, 3], strings([b"a", b"b"]))],
                  model="s")
    assert error_of(req, STRINGS) == (
        "[request id: <id_unknown>] expected 3 string elements for inference input "
        "'TEXT' for model 's', got 2")


def test_bytes_input_too_many_elements():
    req = request([DecodedInput("TEXT", "BYTES", [1, 3], strings(list(b"abcde")))],
                  model="s")
    assert error_of(req, STRINGS) == (
        "[request id: <id_unknown>] unexpected number of string elements 4 for "
        "inference input 'TEXT' for model 's', expecting 3")


def test_bytes_input_truncated():
    data = strings([b"a", b"b", b"ccc"])
    req = request([DecodedInput("TEXT", "BYTES", [1, 3], data[:-1])], model="s")
    assert "element byte size exceeds the end of the buffer" in error_of(req, STRINGS)
    data = strings([b"a", b"b"]) + struct.pack("<I", 1)[:2]
    req = request([DecodedInput("TEXT", "BYTES", [1, 3], memoryview(data))], model="s")
    assert "element byte size indicator exceeds the end of the buffer" in error_of(
        req, STRINGS)


def test_dims_str():
    assert dims_str([-1, 16]) == "[-1,16]"
    assert dims_str([]) == "[]"


def test_config_cache_follows_config_replacement():
    first = config('name: "c" max_batch_size: 1 input [{name: "A" data_type: TYPE_FP32 '
                   'dims: [1]}] output [{name: "B" data_type: TYPE_FP32 dims: [1]}]')
    req = request([tensor("A", np.zeros((1, 1), np.float32))], model="c")
    assert validate_request(req, first) == 1
    second = config('name: "c" max_batch_size: 1 input [{name: "A" data_type: TYPE_INT32 '
                    'dims: [1]}] output [{name: "B" data_type: TYPE_FP32 dims: [1]}]')
    assert "expects 'INT32'" in error_of(req, second)
