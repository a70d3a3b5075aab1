"""Bad requests get the protocol's own error form, and the server stays up."""

import http.client
import json

import numpy as np
import pytest
import tritonclient.utils as tu

from tests.e2e.clients import PROTOCOLS, client, infer_input

pytestmark = pytest.mark.e2e

HTTP_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "UNAVAILABLE": 503}


def _vec(n=16, dtype=np.float32):
    return np.arange(n, dtype=dtype)


def _expect(protocol, server, model, inputs, grpc_status, *needles, version=""):
    c = client(server, protocol)
    with pytest.raises(tu.InferenceServerException) as exc:
        c.infer(model, inputs, model_version=version)
    err = exc.value
    if protocol == "http":
        assert err.status() == str(HTTP_STATUS[grpc_status]), err
    else:
        assert err.status() == f"StatusCode.{grpc_status}", err
    for needle in needles:
        assert needle in err.message(), err.message()
    # the server is still there and answering
    assert c.is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model(server, protocol):
    _expect(protocol, server, "no_such_model", [infer_input(protocol, "INPUT0", _vec(), "FP32")],
            "NOT_FOUND", "no_such_model")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_version(server, protocol):
    _expect(protocol, server, "add_sub", [infer_input(protocol, "INPUT0", _vec(), "FP32")],
            "NOT_FOUND", "add_sub", version="3")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_missing_input(server, protocol):
    _expect(protocol, server, "add_sub", [infer_input(protocol, "INPUT0", _vec(), "FP32")],
            "INVALID_ARGUMENT", "INPUT1")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unexpected_input(server, protocol):
    inputs = [infer_input(protocol, n, _vec(), "FP32") for n in ("INPUT0", "INPUT1", "EXTRA")]
    _expect(protocol, server, "add_sub", inputs, "INVALID_ARGUMENT", "EXTRA")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_datatype(server, protocol):
    inputs = [infer_input(protocol, "INPUT0", _vec(dtype=np.int32), "INT32"),
              infer_input(protocol, "INPUT1", _vec(), "FP32")]
    _expect(protocol, server, "add_sub", inputs, "INVALID_ARGUMENT", "INPUT0", "INT32", "FP32")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shape_mismatch(server, protocol):
    inputs = [infer_input(protocol, "INPUT0", _vec(15), "FP32"),
              infer_input(protocol, "INPUT1", _vec(15), "FP32")]
    # both are wrong: Triton 2.51 names the last input first (its hash map's order;
    # tests/data/triton_errors_2.51.json: missing_batch_dim)
    _expect(protocol, server, "add_sub", inputs, "INVALID_ARGUMENT", "INPUT1", "shape")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_too_large(server, protocol):
    x = np.zeros((9, 4), dtype=np.float32)  # batch_probe: max_batch_size 8
    _expect(protocol, server, "batch_probe", [infer_input(protocol, "INPUT0", x, "FP32")],
            "INVALID_ARGUMENT", "batch")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_byte_size_mismatch(server, protocol):
    x = np.zeros((1, 16), dtype=np.float32)
    inp = infer_input(protocol, "INPUT0", x, "FP32")
    inp.set_shape([1, 17])  # the shape now promises 68 bytes; 64 are sent
    _expect(protocol, server, "identity_fp32", [inp], "INVALID_ARGUMENT", "INPUT0")


def _post(server, path, body: bytes, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_malformed_json(server):
    status, body = _post(server, "/v2/models/identity_fp32/infer", b'{"inputs": [')
    assert status == 400
    assert json.loads(body)["error"]


def test_json_data_count_mismatch(server):
    req = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]}
    status, body = _post(server, "/v2/models/identity_fp32/infer", json.dumps(req).encode())
    assert status == 400
    # Triton 2.51's words, which name no input (triton_errors_2.51.json: http_json_data_count)
    assert json.loads(body)["error"] == ("Unable to parse 'data': Shape does not match true "
                                         "shape of 'data' field")


def test_binary_header_longer_than_body(server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, body = _post(server, "/v2/models/identity_fp32/infer", header + bytes(16),
                         {"Inference-Header-Content-Length": str(len(header) + 100)})
    assert status == 400
    assert json.loads(body)["error"]


def test_binary_size_leaves_bytes_over(server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, body = _post(server, "/v2/models/identity_fp32/infer", header + bytes(20),
                         {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert json.loads(body)["error"]


def test_server_survives_and_serves_after_errors(server):
    x = np.ones((1, 16), dtype=np.float32)
    for protocol in PROTOCOLS:
        r = client(server, protocol).infer("identity_fp32", [infer_input(protocol, "INPUT0", x, "FP32")])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
