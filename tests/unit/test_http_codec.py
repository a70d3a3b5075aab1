"""frontend.http_codec: request decoding and response encoding, against tritonclient's
own encoder and decoder so the wire format is proven both ways."""

import gzip
import json
import struct
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from frontend import http_codec
from frontend.http_codec import (
    decode_infer_request, decode_raw_request, encode_infer_response)
from frontend.types import (
    DecodedInput, DecodedRequest, InferResult, OutputTensor, RequestedOutput)
from shm.datatypes import deserialize_bytes, serialize_bytes
from shm.errors import ErrorCode, InferError


def client_body(arrays, binary=True, outputs=None, **kwargs):
    """What tritonclient.http sends for {name: array}."""
    inputs = []
    for name, array in arrays.items():
        dtype = "BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(
            array.dtype)
        inp = httpclient.InferInput(name, list(array.shape), dtype)
        inp.set_data_from_numpy(array, binary_data=binary)
        inputs.append(inp)
    return httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, **kwargs)


def decoded_array(inp: DecodedInput) -> np.ndarray:
    if inp.datatype == "BYTES":
        return deserialize_bytes(inp.data).reshape(inp.shape)
    dtype = httpclient.triton_to_np_dtype(inp.datatype)
    return np.frombuffer(inp.data, dtype=dtype).reshape(inp.shape)


def bad(body, header_length=None, name="m") -> str:
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    with pytest.raises(InferError) as info:
        decode_infer_request(body, header_length, name)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


ARRAYS = {
    "FP32": np.arange(16, dtype=np.float32).reshape(1, 16),
    "INT64": np.array([[1, -2, 3]], dtype=np.int64),
    "UINT8": np.array([[0, 255]], dtype=np.uint8),
    "BOOL": np.array([[True, False, True]]),
    "FP16": np.array([[0.5, -1.25]], dtype=np.float16),
    "BYTES": np.array([[b"hello", b"", "wörld".encode()]], dtype=object),
}


# ----------------------------------------------------------------------- decoding


@pytest.mark.parametrize("binary", [True, False])
def test_decodes_tritonclient_requests(binary):
    arrays = dict(ARRAYS)
    if not binary:
        del arrays["FP16"]  # tritonclient refuses FP16 as JSON
    body, header_length = client_body(arrays, binary=binary, request_id="r-1")
    req = decode_infer_request(body, header_length, "m", "2")
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "r-1")
    assert [i.name for i in req.inputs] == list(arrays)
    for inp in req.inputs:
        expected = arrays[inp.name]
        assert inp.shape == list(expected.shape)
        np.testing.assert_array_equal(decoded_array(inp), expected)
    assert req.outputs is None
    assert req.parameters == {"binary_data_output": True}


def test_binary_inputs_are_zero_copy_views_of_the_body():
    body, header_length = client_body({"A": ARRAYS["FP32"], "B": ARRAYS["INT64"]})
    req = decode_infer_request(body, header_length, "m")
    for inp in req.inputs:
        assert isinstance(inp.data, memoryview) and inp.data.obj is body
    assert req.inputs[0].data.nbytes == 64 and req.inputs[1].data.nbytes == 24


def test_json_data_nested_and_flat():
    for data in ([[1, 2, 3], [4, 5, 6]], [1, 2, 3, 4, 5, 6]):
        body = {"inputs": [{"name": "X", "shape": [2, 3], "datatype": "INT32",
                            "data": data}]}
        req = decode_infer_request(json.dumps(body).encode(), None, "m")
        np.testing.assert_array_equal(decoded_array(req.inputs[0]),
                                      np.arange(1, 7, dtype=np.int32).reshape(2, 3))


def test_json_bytes_and_bool_data():
    body = {"inputs": [
        {"name": "S", "shape": [1, 2], "datatype": "BYTES", "data": [["ab", "ü"]]},
        {"name": "B", "shape": [2], "datatype": "BOOL", "data": [True, False]}]}
    req = decode_infer_request(json.dumps(body).encode(), None, "m")
    assert bytes(req.inputs[0].data) == serialize_bytes(
        np.array(["ab", "ü"], dtype=object))
    assert bytes(req.inputs[1].data) == b"\x01\x00"


@pytest.mark.parametrize("raw", [b"\xff\xfeab", b"\x80", b"\xc3", b"\xc3(", b"\xc0\xaf",
                                 b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
def test_json_bytes_data_that_is_not_utf8_reaches_the_model_unchanged(raw):
    """Rule (issue 26, 8): bytes that are not UTF-8 inside a BYTES input's JSON `data`
    strings are taken, and the model gets them as they came, as on Triton 2.51
    (checked on it for each of these: 200, and its identity model's JSON output gave
    the same bytes back). Everything else in the body must still be JSON."""
    body = (b'{"id":"r1","inputs":[{"name":"S","shape":[1,2],"datatype":"BYTES",'
            b'"data":["' + raw + b'","ok"]}]}')
    req = decode_infer_request(body, None, "m")
    assert req.id == "r1"
    assert bytes(req.inputs[0].data) == serialize_bytes(np.array([raw, b"ok"], dtype=object))
    assert "failed to parse the request JSON buffer" in bad(body[:-2] + b"NaN}")


@pytest.mark.parametrize("body", [
    b'{"id":"\xff","inputs":[]}',
    b'{"inputs":[{"name":"S\xff","shape":[1],"datatype":"BYTES","data":["a"]}]}',
    b'{"parameters":{"k":"\xff"},"inputs":[]}',
    b'{"inputs":[{"name":"S","shape":[2],"datatype":"BYTES","data":["\xff","\\ud800"]}]}'])
def test_bytes_not_utf8_outside_bytes_data_are_refused(body):
    """Rule: names, the id and parameters are text: bytes that are not UTF-8 there are
    a 400 with the decoder's words (Triton copies them through; we do not, as the id
    and names come back in answers and logs), and so is an escaped lone surrogate,
    which is no character at all."""
    message = bad(body)
    assert message.startswith("failed to parse the request JSON buffer: ") \
        or message.startswith("Unable to parse 'data'"), message


def test_request_fields_pass_through():
    outputs = [httpclient.InferRequestedOutput("OUT0", binary_data=False),
               httpclient.InferRequestedOutput("OUT1", class_count=3)]
    body, header_length = client_body(
        {"X": ARRAYS["FP32"]}, outputs=outputs, sequence_id=7, sequence_start=True,
        priority=2, timeout=100, parameters={"custom": "v", "n": 1.5})
    req = decode_infer_request(body, header_length, "m")
    assert req.parameters == {"sequence_id": 7, "sequence_start": True,
                              "sequence_end": False, "priority": 2, "timeout": 100,
                              "custom": "v", "n": 1.5}
    assert [(o.name, o.binary_data, o.class_count) for o in req.outputs] == [
        ("OUT0", False, 0), ("OUT1", True, 3)]


def test_shared_memory_input_has_no_data():
    body = {"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "parameters": {
        "shared_memory_region": "r0", "shared_memory_byte_size": 16,
        "shared_memory_offset": 0}}],
        "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "r1",
                                                 "shared_memory_byte_size": 16}}]}
    req = decode_infer_request(json.dumps(body).encode(), None, "m")
    assert req.inputs[0].data is None
    assert req.inputs[0].parameters["shared_memory_region"] == "r0"
    assert req.outputs[0].parameters["shared_memory_region"] == "r1"
    assert req.outputs[0].binary_data is None


def test_tritonclient_shared_memory_request():
    # what InferInput/InferRequestedOutput.set_shared_memory put on the wire, mixed
    # with a binary input and an ordinary output
    data = np.arange(4, dtype=np.int32)
    shm_in = httpclient.InferInput("X", [4], "FP32")
    shm_in.set_shared_memory("in_region", 16, offset=32)
    raw_in = httpclient.InferInput("Z", [4], "INT32")
    raw_in.set_data_from_numpy(data, binary_data=True)
    shm_out = httpclient.InferRequestedOutput("Y")
    shm_out.set_shared_memory("out_region", 64)
    plain_out = httpclient.InferRequestedOutput("W", binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        [shm_in, raw_in], outputs=[shm_out, plain_out])
    req = decode_infer_request(body, header_length, "m")
    assert req.inputs[0].data is None
    assert req.inputs[0].parameters == {"shared_memory_region": "in_region",
                                        "shared_memory_byte_size": 16,
                                        "shared_memory_offset": 32}
    assert bytes(req.inputs[1].data) == data.tobytes()
    y, w = req.outputs
    assert y.parameters["shared_memory_region"] == "out_region"
    assert y.parameters["shared_memory_byte_size"] == 64
    assert "shared_memory_offset" not in y.parameters
    assert y.binary_data is False  # tritonclient turns binary_data off for shm outputs
    assert (w.binary_data, w.parameters) == (True, {"binary_data": True})


@pytest.mark.parametrize("params,message", [
    ({"shared_memory_region": 7, "shared_memory_byte_size": 16},
     "Unable to parse 'shared_memory_region'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": -16},
     "Unable to parse 'shared_memory_byte_size'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": "16"},
     "Unable to parse 'shared_memory_byte_size'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 16,
      "shared_memory_offset": -1}, "Unable to parse 'shared_memory_offset'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 16,
      "shared_memory_offset": 1.5}, "Unable to parse 'shared_memory_offset'"),
])
def test_shared_memory_parameter_types(params, message):
    # Triton's CheckSharedMemoryData, for inputs and requested outputs alike
    assert bad({"inputs": [{"name": "X", "shape": [4], "datatype": "FP32",
                            "parameters": params}]}) == message
    assert bad({"inputs": [], "outputs": [{"name": "Y", "parameters": params}]}) == message


def test_empty_outputs_list_means_all_outputs():
    body = {"inputs": [], "outputs": []}
    assert decode_infer_request(json.dumps(body).encode(), None, "m").outputs is None


def test_zero_size_binary_and_empty_tensor():
    body = {"inputs": [{"name": "X", "shape": [0, 3], "datatype": "FP32",
                        "parameters": {"binary_data_size": 0}},
                       {"name": "Y", "shape": [0], "datatype": "INT32", "data": []}]}
    raw = json.dumps(body).encode()
    req = decode_infer_request(raw, len(raw), "m")
    assert bytes(req.inputs[0].data) == b"" and bytes(req.inputs[1].data) == b""


def test_header_length_parsing():
    assert http_codec.parse_header_length(None, 10) is None
    assert http_codec.parse_header_length("4", 10) == 4
    with pytest.raises(InferError, match=r"inference header size should be in range "
                       r"\(0, 10\), got: 11"):
        http_codec.parse_header_length("11", 10)
    with pytest.raises(InferError, match="Unable to parse Inference-Header"):
        http_codec.parse_header_length("x", 10)
    with pytest.raises(InferError, match="should be in range"):
        http_codec.parse_header_length("-1", 10)


def test_binary_data_larger_than_body():
    body, header_length = client_body({"X": ARRAYS["FP32"]})
    assert bad(body[:-4], header_length) == (
        "unexpected size for input 'X', expecting 4 additional bytes for model 'm'")


def test_leftover_bytes_after_inputs():
    body, header_length = client_body({"X": ARRAYS["FP32"]})
    assert bad(body + b"xx", header_length) == (
        "unexpected additional input data for model 'm'")
    header = json.dumps({"inputs": []}).encode()
    assert "unexpected additional input data" in bad(header + b"x", len(header))


def test_binary_input_without_header_length():
    body, _ = client_body({"X": ARRAYS["FP32"]})
    header = body[:body.index(b"}}]") + 3]  # the JSON alone, no length header
    msg = bad(header + b"}", None)
    # Triton 2.51: the binary part is missing (http_binary_size_without_header)
    assert msg == "unexpected size for input 'X', expecting 64 additional bytes for model 'm'"


def test_header_length_that_splits_the_json():
    body, header_length = client_body({"X": ARRAYS["FP32"]})
    assert "failed to parse the request JSON buffer" in bad(body, header_length - 3)


def test_malformed_json():
    assert "failed to parse the request JSON buffer" in bad(b"{not json")
    assert "expected a JSON object" in bad(b"[1, 2]")


def test_required_fields():
    # Triton 2.51's words (tests/data/triton_errors_2.51.json: http_no_inputs_field)
    assert bad({}) == ("Unable to parse 'inputs': attempt to access non-existing object "
                       "member 'inputs'")
    assert bad({"inputs": {}}) == (
        "Unable to parse 'inputs': attempt to access JSON non-array as array")
    assert bad({"id": 5, "inputs": []}) == "Unable to parse 'id'"
    base = {"shape": [1], "datatype": "FP32", "data": [1.0]}
    assert bad({"inputs": [dict(base, name=3)]}) == "Unable to parse 'name'"
    assert bad({"inputs": [dict(base, name="X", datatype=None)]}) == (
        "Unable to parse 'datatype'")
    for shape in ([-1], [1.5], [True]):  # Triton 2.51: http_shape_not_ints, negative_dim
        assert bad({"inputs": [dict(base, name="X", shape=shape)]}) == (
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer")
    assert bad({"inputs": [dict(base, name="X", shape="1")]}) == (
        "Unable to parse 'shape': attempt to access JSON non-array as array")


def test_input_content_must_be_exactly_one_kind():
    item = {"name": "X", "shape": [1], "datatype": "FP32"}
    assert bad({"inputs": [item]}).endswith("But no field is set")
    both = dict(item, data=[1.0], parameters={"binary_data_size": 4})
    assert bad({"inputs": [both]}).endswith("But set 'data' 'binary_data_size'")
    shm = dict(item, data=[1.0], parameters={"shared_memory_region": "r"})
    assert bad({"inputs": [shm]}).startswith(
        "Input must set only one of the following fields: 'data', 'binary_data_size' "
        "in 'parameters', 'shared_memory_region' in 'parameters'. But set")


def test_bad_binary_data_size():
    item = {"name": "X", "shape": [1], "datatype": "FP32",
            "parameters": {"binary_data_size": -4}}
    assert bad({"inputs": [item]}) == "Unable to parse 'binary_data_size'"


def test_json_data_element_count_mismatch():
    msg = "Unable to parse 'data': Shape does not match true shape of 'data' field"
    item = {"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0]}
    assert bad({"inputs": [item]}) == msg  # Triton 2.51's words exactly
    item["data"] = [[1.0, 2.0], [3.0]]  # ragged
    assert bad({"inputs": [item]}) == msg


def test_json_data_of_the_wrong_type():
    item = {"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}
    assert bad({"inputs": [item]}) == ("Unable to parse 'data': attempt to access JSON "
                                       "non-signed-integer as signed-integer")
    # Triton reads signed types as int64 and unsigned ones as uint64: never wrapped
    item = {"name": "X", "shape": [1], "datatype": "UINT8", "data": [-1]}
    assert bad({"inputs": [item]}) == ("Unable to parse 'data': attempt to access JSON "
                                       "non-unsigned-integer as unsigned-integer")
    item = {"name": "X", "shape": [1], "datatype": "INT64", "data": [2**63]}
    assert bad({"inputs": [item]}) == ("Unable to parse 'data': attempt to access JSON "
                                       "non-signed-integer as signed-integer")
    item = {"name": "X", "shape": [2], "datatype": "UINT64", "data": [2**63, 1]}
    req = decode_infer_request(json.dumps({"inputs": [item]}).encode(), None, "m")
    assert np.frombuffer(req.inputs[0].data, np.uint64).tolist() == [2**63, 1]
    item = {"name": "X", "shape": [1], "datatype": "FP32", "data": [True]}
    assert bad({"inputs": [item]}) == ("Unable to parse 'data': attempt to access JSON "
                                       "non-number as double")
    item = {"name": "X", "shape": [1], "datatype": "BYTES", "data": [1]}
    assert "expected a string element" in bad({"inputs": [item]})
    item = {"name": "X", "shape": [1], "datatype": "BF16", "data": [1.0]}
    assert bad({"inputs": [item]}) == (
        "receiving BF16 data via JSON is not supported. Please use the binary data "
        "format for input X")
    item = {"name": "X", "shape": [1], "datatype": "FP8", "data": [1.0]}
    assert bad({"inputs": [item]}) == "invalid datatype for input X"


def test_request_parameter_checks():
    def params(p):
        return bad({"inputs": [], "parameters": p})
    assert params({"triton_x": 1}).startswith("parameter keys starting with 'triton_'")
    # Triton 2.51 answers these with HTTP 500 and the JSON reader's words; the fault
    # is the client's, so 400 with those words
    for key, value in (("priority", -1), ("priority", 2.0), ("timeout", "5"),
                       ("timeout", -5), ("timeout", True), ("timeout", 1.5),
                       ("priority", None), ("timeout", 2**64)):
        with pytest.raises(InferError) as info:
            decode_infer_request(json.dumps({"inputs": [], "parameters": {key: value}})
                                 .encode(), None, "m")
        assert info.value.code == ErrorCode.INVALID_ARG
        assert info.value.message == (f"Unable to parse '{key}': attempt to access JSON "
                                      "non-unsigned-integer as unsigned-integer")
    assert params({"binary_data_output": 1}) == "Unable to parse 'binary_data_output'"
    assert params({"sequence_id": 1.5}) == "Unable to parse 'sequence_id'"
    # Triton 2.51 answers 501 for this, on any model
    assert params({"sequence_id": "x" * 129}) == ("string correlation ID cannot be longer "
                                                  "than 128 characters")
    assert params({"sequence_id": "\u00e9" * 65}).startswith("string correlation ID")
    assert params({"x": [1]}) == ("parameter 'x' has invalid type. It should be either "
                                  "'int', 'bool', or 'string'.")
    for value in ([1], None, "p", 5):
        assert params(value) == ("failed to get request params.: attempt to get members "
                                 "for non-object")
    req = decode_infer_request(
        json.dumps({"inputs": [], "parameters": {"sequence_id": "abc"}}).encode(),
        None, "m")
    assert req.parameters == {"sequence_id": "abc"}


def test_requested_output_checks():
    def outputs(o):
        return bad({"inputs": [], "outputs": o})
    assert outputs([{"name": 1}]) == "Unable to parse 'name'"
    assert outputs([{"name": "Y", "parameters": {"binary_data": "yes"}}]) == (
        "Unable to parse 'binary_data'")
    assert outputs([{"name": "Y", "parameters": {"classification": -1}}]) == (
        "Unable to set 'classification'")
    assert outputs([{"name": "Y", "parameters": {
        "shared_memory_region": "r", "classification": 2}}]) == (
        "Output can't set both 'shared_memory_region' and 'classification'")
    assert outputs([{"name": "Y", "parameters": {
        "shared_memory_region": "r", "binary_data": True}}]) == (
        "Output can't set both 'shared_memory_region' and 'binary_data'")
    # Triton 2.51: 500 with these words (its JSON reader's); 400 here, the same words
    for value in ({"name": "Y"}, {}, None, 0, "Y"):
        assert outputs(value) == ("Unable to parse 'outputs': attempt to access JSON "
                                  "non-array as array")


def test_decompress():
    assert http_codec.decompress(gzip.compress(b"abc"), "gzip") == b"abc"
    assert http_codec.decompress(zlib.compress(b"abc"), "deflate") == b"abc"
    assert http_codec.decompress(b"abc", "identity") == b"abc"
    with pytest.raises(InferError) as info:
        http_codec.decompress(b"abc", "br")
    assert info.value.code == ErrorCode.UNSUPPORTED
    with pytest.raises(InferError, match="failed to decompress"):
        http_codec.decompress(b"not gzip", "gzip")


RAW_CONFIG = text_format.Parse("""
name: "raw" max_batch_size: 4
input [{name: "IN" data_type: TYPE_FP32 dims: [-1]}]
output [{name: "OUT" data_type: TYPE_FP32 dims: [-1]}]
""", model_config_pb2.ModelConfig())


def test_raw_binary_request():
    body = np.arange(6, dtype=np.float32).tobytes()
    req = decode_raw_request(body, RAW_CONFIG, "raw")
    (inp,) = req.inputs
    assert (inp.name, inp.datatype, inp.shape) == ("IN", "FP32", [1, 6])
    assert bytes(inp.data) == body
    assert req.parameters == {"binary_data_output": True}
    strings = text_format.Parse(
        'name: "s" input [{name: "T" data_type: TYPE_STRING dims: [1]}]',
        model_config_pb2.ModelConfig())
    req = decode_raw_request(b"hello", strings, "s")
    assert bytes(req.inputs[0].data) == b"\x05\x00\x00\x00hello"
    with pytest.raises(InferError, match="Raw request must only have 1 input"):
        decode_raw_request(b"", model_config_pb2.ModelConfig(), "x")


# ----------------------------------------------------------------------- encoding


def request_for(outputs=None, binary_output=None, id=""):
    params = {} if binary_output is None else {"binary_data_output": binary_output}
    return DecodedRequest("m", "", id, [], outputs, params)


def result_of(arrays, id=""):
    outs = []
    for name, array in arrays.items():
        if array.dtype == object:
            outs.append(OutputTensor(name, "BYTES", list(array.shape),
                                     serialize_bytes(array)))
        else:
            outs.append(OutputTensor(name, httpclient.np_to_triton_dtype(array.dtype),
                                     list(array.shape), memoryview(array).cast("B")))
    return InferResult("m", "1", id, outs)


def client_result(body, header_length):
    return httpclient.InferResult.from_response_body(body, header_length=header_length)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_decodes_our_responses(binary):
    body, header_length = encode_infer_response(
        result_of(ARRAYS, id="r9"), request_for(binary_output=binary))
    assert (header_length is not None) == binary
    got = client_result(body, header_length)
    response = got.get_response()
    assert response["id"] == "r9" and response["model_name"] == "m"
    assert response["model_version"] == "1"
    for name, expected in ARRAYS.items():
        actual = got.as_numpy(name)
        if expected.dtype == object and not binary:
            # JSON carries strings; tritonclient gives them back as str objects
            expected = np.array([[e.decode() for e in expected.ravel()]], dtype=object)
        np.testing.assert_array_equal(actual.reshape(expected.shape), expected)
        assert actual.dtype == expected.dtype


def test_json_output_shape():
    body, header_length = encode_infer_response(
        result_of({"Y": np.array([[1.5, 2.0]], np.float32), "S": ARRAYS["BYTES"]}),
        request_for())
    assert header_length is None
    assert json.loads(body) == {
        "model_name": "m", "model_version": "1", "outputs": [
            {"name": "Y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]},
            {"name": "S", "datatype": "BYTES", "shape": [1, 3],
             "data": ["hello", "", "wörld"]}]}


def test_per_output_binary_flag_wins_over_request_default():
    arrays = {"A": np.ones(2, np.float32), "B": np.zeros(2, np.float32),
              "C": np.ones(1, np.int32)}
    outputs = [RequestedOutput("A", binary_data=True), RequestedOutput("B", False),
               RequestedOutput("C")]
    body, header_length = encode_infer_response(
        result_of(arrays), request_for(outputs, binary_output=True))
    header = json.loads(body[:header_length])
    kinds = {o["name"]: ("data" in o, "binary_data_size" in o.get("parameters", {}))
             for o in header["outputs"]}
    assert kinds == {"A": (False, True), "B": (True, False), "C": (False, True)}
    assert body[header_length:] == np.ones(2, np.float32).tobytes() + np.ones(
        1, np.int32).tobytes()


def test_non_utf8_bytes_and_bf16_fall_back_to_binary():
    blob = np.array([b"\xff\xfe"], dtype=object)
    bf16 = OutputTensor("H", "BF16", [2], b"\x80\x3f\x00\x40")
    result = result_of({"B": blob})
    result.outputs.append(bf16)
    body, header_length = encode_infer_response(result, request_for())
    assert header_length is not None
    got = client_result(body, header_length)
    assert got.as_numpy("B")[0] == b"\xff\xfe"
    assert got.get_output("H")["parameters"] == {"binary_data_size": 4}


def test_shared_memory_output_carries_no_data():
    # as Triton's FinalizeResponse: name, datatype and shape only (no data, no
    # binary_data_size, no shared_memory_* echo), even when the rest is binary
    result = InferResult("m", "1", "", [OutputTensor(
        "Y", "FP32", [4], None, {"shared_memory_region": "r",
                                 "shared_memory_byte_size": 16, "other": 1})])
    body, header_length = encode_infer_response(result, request_for(binary_output=True))
    assert header_length is None
    assert json.loads(body)["outputs"] == [{"name": "Y", "datatype": "FP32",
                                            "shape": [4], "parameters": {"other": 1}}]


def test_mixed_shared_memory_and_binary_outputs_parse_with_tritonclient():
    y = np.arange(4, dtype=np.float32)
    result = InferResult("m", "1", "", [
        OutputTensor("IN_SHM", "FP32", [2, 2], None, {"shared_memory_region": "r",
                                                      "shared_memory_byte_size": 16}),
        OutputTensor("Y", "FP32", [4], memoryview(y).cast("B"))])
    body, header_length = encode_infer_response(result, request_for(binary_output=True))
    parsed = client_result(body, header_length)
    np.testing.assert_array_equal(parsed.as_numpy("Y"), y)
    assert parsed.get_output("IN_SHM") == {"name": "IN_SHM", "datatype": "FP32",
                                           "shape": [2, 2]}


def test_output_size_mismatch_is_internal_error():
    result = InferResult("m", "1", "", [OutputTensor("Y", "FP32", [4], b"\x00" * 12)])
    with pytest.raises(InferError) as info:
        encode_infer_response(result, request_for())
    assert info.value.code == ErrorCode.INTERNAL


def test_body_holds_no_view_into_the_result():
    array = np.ones(4, np.float32)
    body, header_length = encode_infer_response(result_of({"Y": array}),
                                                request_for(binary_output=True))
    array[:] = 7  # the result's buffer is reused after release()
    assert np.frombuffer(body[header_length:], np.float32).tolist() == [1.0] * 4


def test_classification():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    outputs = [RequestedOutput("P", binary_data=False, class_count=2)]
    body, header_length = encode_infer_response(
        result_of({"P": scores}), request_for(outputs), batching=True,
        labels={"P": ["cat", "dog"]})
    (out,) = json.loads(body)["outputs"]
    assert out == {"name": "P", "datatype": "BYTES", "shape": [2, 2], "data": [
        "0.700000:1:dog", "0.200000:2", "0.500000:0:cat", "0.250000:1:dog"]}
    # unbatched, integer scores, k larger than the class count, binary
    outputs = [RequestedOutput("P", binary_data=True, class_count=5)]
    body, header_length = encode_infer_response(
        result_of({"P": np.array([3, 9], np.int32)}), request_for(outputs))
    got = client_result(body, header_length).as_numpy("P")
    assert got.tolist() == [b"9:1", b"3:0"]


def test_classification_of_unsupported_type():
    outputs = [RequestedOutput("S", class_count=1)]
    with pytest.raises(InferError, match="class result not available for output due "
                       "to unsupported type 'BYTES'"):
        encode_infer_response(result_of({"S": ARRAYS["BYTES"]}), request_for(outputs))


def test_error_body_and_accept_encoding():
    assert json.loads(http_codec.encode_error("boom")) == {"error": "boom"}
    assert http_codec.accepted_encoding(None) is None
    assert http_codec.accepted_encoding("gzip") == "gzip"
    assert http_codec.accepted_encoding("gzip;q=0.5, deflate;q=0.8") == "deflate"
    assert http_codec.accepted_encoding("identity, gzip;q=0.5") is None
    assert http_codec.accepted_encoding("br") is None
    assert gzip.decompress(http_codec.compress(b"x" * 100, "gzip")) == b"x" * 100
    assert zlib.decompress(http_codec.compress(b"x" * 100, "deflate")) == b"x" * 100


def test_length_prefix_helper_matches_struct():
    assert serialize_bytes(np.array([b"ab"], dtype=object)) == struct.pack("<I", 2) + b"ab"


def test_standard_library_json_fallback_agrees(monkeypatch):
    import json as stdlib_json

    body, header_length = client_body({"X": ARRAYS["FP32"], "S": ARRAYS["BYTES"]})
    fast_request = decode_infer_request(body, header_length, "m")
    fast = encode_infer_response(result_of(ARRAYS, id="i"), request_for())
    monkeypatch.setattr(http_codec, "json_loads",
                        lambda data: stdlib_json.loads(bytes(data)))
    monkeypatch.setattr(http_codec, "json_dumps", lambda obj: stdlib_json.dumps(
        obj, separators=(",", ":"), ensure_ascii=False).encode())
    slow_request = decode_infer_request(body, header_length, "m")
    assert [(i.name, i.shape, bytes(i.data)) for i in slow_request.inputs] == [
        (i.name, i.shape, bytes(i.data)) for i in fast_request.inputs]
    slow = encode_infer_response(result_of(ARRAYS, id="i"), request_for())
    assert json.loads(slow[0]) == json.loads(fast[0])
