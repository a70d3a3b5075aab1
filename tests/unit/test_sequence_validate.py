"""Frontend checks of sequence requests: the correlation id's type against the model's
CONTROL_SEQUENCE_CORRID (Triton's InferenceRequest::ValidateCorrelationId), and the
sequence parameters as both codecs read them."""

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from frontend.types import DecodedInput, DecodedRequest
from frontend.validate import validate_request
from shm.errors import ErrorCode, InferError


def config(corrid_type: str | None):
    controls = ""
    if corrid_type:
        controls = f"""control_input [ {{ name: "CORRID" control [ {{
            kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }} ]"""
    return text_format.Parse(f"""
name: "acc" backend: "python" max_batch_size: 4
sequence_batching {{ {controls} }}
input [{{name: "INPUT" data_type: TYPE_INT32 dims: [1]}}]
output [{{name: "OUTPUT" data_type: TYPE_INT32 dims: [1]}}]
""", model_config_pb2.ModelConfig())


def request(**params):
    data = np.zeros((1, 1), np.int32).tobytes()
    return DecodedRequest("acc", "", "", [DecodedInput("INPUT", "INT32", [1, 1], data)],
                          None, params)


@pytest.mark.parametrize("corrid_type", ["TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32",
                                         "TYPE_INT32"])
def test_string_id_on_integer_corrid_is_refused(corrid_type):
    """Rule: a string id on a model whose CORRID is an integer type fails with
    Triton's message (its later cores; 2.51 let it through and wrote garbage)."""
    with pytest.raises(InferError) as e:
        validate_request(request(sequence_id="abc", sequence_start=True), config(corrid_type))
    assert e.value.code == ErrorCode.INVALID_ARG
    expected = corrid_type[5:]
    assert e.value.message == (f"[request id: <id_unknown>] sequence batching control "
                               f"'CORRID' data-type is 'BYTES', but model 'acc' expects "
                               f"'{expected}'")
    assert validate_request(request(sequence_id=7), config(corrid_type)) == 1


def test_integer_id_on_string_corrid_is_refused():
    """Rule: a number (the default 0 too) on a TYPE_STRING CORRID is refused."""
    for params in ({"sequence_id": 7}, {}):
        with pytest.raises(InferError) as e:
            validate_request(request(**params), config("TYPE_STRING"))
        assert "data-type is 'UINT64', but model 'acc' expects 'BYTES'" in e.value.message
    assert validate_request(request(sequence_id="s"), config("TYPE_STRING")) == 1


def test_no_corrid_control_takes_either_kind():
    """Rule: without a CORRID control any id type is fine (the scheduler checks the
    rest)."""
    for sid in (5, "five"):
        assert validate_request(request(sequence_id=sid), config(None)) == 1


def test_codecs_read_sequence_parameters():
    """Rule: sequence_id as uint64 or string, sequence_start/end as bools, over HTTP
    JSON and gRPC parameters."""
    from frontend.grpc_codec import _request_parameters
    from frontend.http_codec import _check_request_parameters as _check_parameters
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest()
    req.parameters["sequence_id"].string_param = "abc"
    req.parameters["sequence_start"].bool_param = True
    assert _request_parameters(req.parameters) == {"sequence_id": "abc",
                                                   "sequence_start": True}
    req.parameters["sequence_id"].uint64_param = 2**63 + 5
    assert _request_parameters(req.parameters)["sequence_id"] == 2**63 + 5
    _check_parameters({"sequence_id": "abc", "sequence_end": True})
    _check_parameters({"sequence_id": 12})
    with pytest.raises(InferError):
        _check_parameters({"sequence_id": -1})
