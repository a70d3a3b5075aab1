"""Protocol details that Triton's own tests probe (issue 11, part 5c): classification
labels, chunked request bodies, a bad ensemble under --exit-on-error; over HTTP and gRPC
where both carry the feature. (Shared-memory registration wording is checked in
test_system_shm.py::test_bad_registrations.)"""

import http.client
import json

import numpy as np
import pytest

from tests.e2e.clients import PROTOCOLS, client, infer_input, module
from tests.e2e.harness import ROOT, ServerProcess

pytestmark = pytest.mark.e2e

MODELS = ROOT / "tests" / "models_protocol"
BAD_ENSEMBLE = ROOT / "tests" / "models_protocol_badens"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(MODELS, "--allow-client-shm=true",
                        # as Triton's RE2: case-insensitive, and its (?-i) prefix
                        "--http-header-forward-pattern", "^X-FWD-",
                        "--grpc-header-forward-pattern", "(?-i)^x-fwd-", frontends=1,
                        log_dir=tmp_path_factory.mktemp("protocol-logs"))
    yield from srv.serve()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classification_labels_in_a_mixed_request(server, protocol):
    """Classification extension: an output whose config names a `label_filename`
    answers "score:index:label" (label = line `index` of the file), top `class_count`
    per batch item; in the same request an output asked without classification comes
    back as its plain tensor. Over gRPC the class count travels as the output's
    `classification` parameter."""
    mod = module(protocol)
    x = np.array([[0.1, 0.7, 0.2, 0.0], [0.5, 0.0, 0.1, 0.9]], dtype=np.float32)
    result = client(server, protocol).infer(
        "classify_labels", [infer_input(protocol, "INPUT0", x, "FP32")],
        outputs=[mod.InferRequestedOutput("SCORES", class_count=2),
                 mod.InferRequestedOutput("PLAIN")])
    assert result.as_numpy("SCORES").tolist() == [
        [b"0.700000:1:dog", b"0.200000:2:bird"], [b"0.900000:3:fish", b"0.500000:0:cat"]]
    np.testing.assert_array_equal(result.as_numpy("PLAIN"), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classification_without_label_file(server, protocol):
    """An output without `label_filename` classifies as "score:index" (no label), and
    class_count larger than the output's size is cut to the size, as Triton does."""
    mod = module(protocol)
    x = np.array([[3, 1, 4, 2]], dtype=np.float32)
    result = client(server, protocol).infer(
        "classify_labels", [infer_input(protocol, "INPUT0", x, "FP32")],
        outputs=[mod.InferRequestedOutput("PLAIN", class_count=9)])
    assert result.as_numpy("PLAIN").tolist() == [
        [b"4.000000:2", b"3.000000:0", b"2.000000:3", b"1.000000:1"]]
    assert result.as_numpy("SCORES") is None  # not requested, not returned


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reshape_applied_to_inputs_and_outputs(server, protocol):
    """Config `reshape`: a request shaped as the input's `dims` ([2, 4]: batch 2, dims
    [4]) is handed to the model in `reshape.shape` ([2, 2, 2]), and the model's output
    in its reshape shape comes back in the output's `dims` ([2, 4]), as Triton's core
    does for every backend."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client(server, protocol).infer(
        "reshape_py", [infer_input(protocol, "INPUT0", x, "FP32")])
    assert result.as_numpy("SEEN").tolist() == [[2, 2, 2], [2, 2, 2]]
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (2, 4)
    np.testing.assert_array_equal(out, x * 2)
    # the request is still checked against `dims`: [1, 2, 2] is the wrong shape
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        client(server, protocol).infer(
            "reshape_py", [infer_input(protocol, "INPUT0", x[:1].reshape(1, 2, 2), "FP32")])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_non_utf8_bytes_output(server, protocol):
    """A BYTES output that is not UTF-8 cannot be a JSON string. Triton 2.51 (run
    against it) writes the raw bytes into the JSON anyway (200, a body no JSON parser
    accepts); here the output goes in the binary form instead, even when JSON was
    asked for, so the client gets the exact bytes in a valid response."""
    mod = module(protocol)
    kwargs = {"binary_data": False} if protocol == "http" else {}
    result = client(server, protocol).infer(
        "bytes_raw", [infer_input(protocol, "INPUT0", np.ones(1, np.float32), "FP32")],
        outputs=[mod.InferRequestedOutput("OUTPUT0", **kwargs)])
    assert result.as_numpy("OUTPUT0").tolist() == [b"\xff\xfeok", b"fine"]


def test_non_utf8_bytes_output_raw_http(server):
    """The same over plain HTTP: the answer is valid (JSON header + binary data, with
    Inference-Header-Content-Length), never a JSON body with invalid UTF-8 in it."""
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                       "data": [1.0]}]}).encode()
        conn.request("POST", "/v2/models/bytes_raw/infer", body=body,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    assert response.status == 200
    length = int(response.getheader("Inference-Header-Content-Length"))
    header = json.loads(raw[:length])  # the JSON part is valid UTF-8 JSON
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(raw) - length
    assert b"\xff\xfeok" in raw[length:]


# Shared-memory registration answers of the real Triton 2.51 (run against it with the
# same calls, over both protocols): (case, HTTP status, gRPC code, message with {name}
# for the region's name and {key} for the key).
SHM_CASES = [
    ("missing key", 500, "INTERNAL", "Unable to open shared memory region: '{key}'"),
    ("past the end", 400, "INVALID_ARGUMENT",
     "failed to register shared memory region '{name}': invalid args"),
    ("offset past the end", 400, "INVALID_ARGUMENT",
     "failed to register shared memory region '{name}': invalid args"),
    ("zero bytes", 400, "INVALID_ARGUMENT",
     "failed to register shared memory region '{name}': unable to process address "
     "spaceInvalid argument"),
    ("twice", 400, "ALREADY_EXISTS", "shared memory region '{name}' already in manager"),
]


@pytest.fixture
def shm_key():
    import os
    import uuid
    key = f"/proto-{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", SHM_CASES, ids=[c[0] for c in SHM_CASES])
def test_shm_registration_errors_in_tritons_words(server, protocol, case, shm_key):
    """Shared-memory registration errors answer with Triton 2.51's status and message
    (the table above was taken from the real server), and the server stays up."""
    import uuid

    from tritonclient.utils import InferenceServerException
    what, status, code, message = case
    c = client(server, protocol)
    name = f"r{uuid.uuid4().hex[:8]}"
    key, size, offset = shm_key, 64, 0
    if what == "missing key":
        key = shm_key + "-gone"
    elif what == "past the end":
        size = 128
    elif what == "offset past the end":
        size, offset = 8, 60
    elif what == "zero bytes":
        size = 0
    elif what == "twice":
        c.register_system_shared_memory(name, key, size, offset)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory(name, key, size, offset)
        assert e.value.message() == message.format(name=name, key=key)
        assert e.value.status() == (str(status) if protocol == "http"
                                    else f"StatusCode.{code}")
    finally:
        c.unregister_system_shared_memory(name)
    assert c.is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shm_unknown_region_status_and_unregister(server, protocol):
    """As Triton 2.51: the status of an unknown region is NOT_FOUND (404) "Unable to
    find system shared memory region: 'X'"; unregistering it succeeds (nothing to do)."""
    from tritonclient.utils import InferenceServerException
    c = client(server, protocol)
    c.unregister_system_shared_memory("nothere")
    with pytest.raises(InferenceServerException) as e:
        c.get_system_shared_memory_status("nothere")
    assert e.value.message() == "Unable to find system shared memory region: 'nothere'"
    assert e.value.status() in ("404", "StatusCode.NOT_FOUND")


def _params_seen(server, protocol: str, headers: dict, **kwargs) -> dict:
    x = np.array([1.0], dtype=np.float32)
    result = client(server, protocol).infer(
        "echo_params", [infer_input(protocol, "INPUT0", x, "FP32")], headers=headers,
        **kwargs)
    return json.loads(result.as_numpy("PARAMS")[0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_header_forward_pattern(server, protocol):
    """--http-header-forward-pattern / --grpc-header-forward-pattern: request headers
    (gRPC metadata) whose name the regular expression matches reach the model as
    string request parameters; others do not. A parameter the request itself sets is
    kept. The pattern matches case-insensitively (HTTP's `^X-FWD-`), as Triton's RE2,
    unless RE2's `(?-i)` says otherwise (gRPC's `(?-i)^x-fwd-`, which Python's re alone
    would refuse); names are forwarded in lower case (HTTP names are case-insensitive,
    gRPC keys lower-case)."""
    # gRPC metadata keys must be lower-case (the client refuses others)
    tenant = "X-Fwd-Tenant" if protocol == "http" else "x-fwd-tenant"
    seen = _params_seen(server, protocol, {tenant: "acme", "x-fwd-trace": "7",
                                           "x-other": "no"},
                        parameters={"x-fwd-trace": "from-body"})
    assert seen["x-fwd-tenant"] == "acme"
    assert seen["x-fwd-trace"] == "from-body"
    assert "x-other" not in seen
    assert not any(k.startswith(":") or k.startswith("grpc-") for k in seen)


def test_header_forward_generate(server):
    """The HTTP generate extension forwards matching headers as well."""
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        conn.request("POST", "/v2/models/echo_params/generate",
                     body=json.dumps({"INPUT0": [1.0]}).encode(),
                     headers={"Content-Type": "application/json", "X-Fwd-Gen": "g",
                              "X-Other": "o"})
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 200, answer
    seen = json.loads(answer["PARAMS"])
    assert seen["x-fwd-gen"] == "g" and "x-other" not in seen


def test_header_forward_stream(server):
    """The gRPC stream (ModelStreamInfer) forwards its call's metadata into each
    request it carries."""
    import queue

    import tritonclient.grpc as grpcclient
    answers: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)),
                   headers={"x-fwd-s": "1", "x-other": "2"})
    try:
        x = np.array([1.0], dtype=np.float32)
        c.async_stream_infer("echo_params", [infer_input("grpc", "INPUT0", x, "FP32")])
        result, error = answers.get(timeout=60)
        assert error is None, error
        seen = json.loads(result.as_numpy("PARAMS")[0])
        assert seen["x-fwd-s"] == "1" and "x-other" not in seen
    finally:
        c.stop_stream()
        c.close()


def _chunked_post(server, path: str, body: bytes, chunk: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        pieces = (body[i:i + chunk] for i in range(0, len(body), chunk))
        conn.request("POST", path, body=pieces, encode_chunked=True,
                     headers={"Content-Type": "application/json",
                              "Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_chunked_request_body(server):
    """HTTP/1.1 `Transfer-Encoding: chunked` request bodies (no Content-Length) are
    accepted, as Triton's HTTP server accepts them: the pieces make one request."""
    request = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                           "data": [1.0, 2.0, 3.0, 4.0]}],
               "outputs": [{"name": "PLAIN"}]}
    status, body = _chunked_post(server, "/v2/models/classify_labels/infer",
                                 json.dumps(request).encode(), chunk=7)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    # a chunked body that is not a valid request is the usual 400, and the server stays up
    status, body = _chunked_post(server, "/v2/models/classify_labels/infer", b"{not json",
                                 chunk=3)
    assert status == 400 and "error" in json.loads(body)
    assert client(server, "http").is_server_ready()


def test_bad_ensemble_exits_by_default(tmp_path):
    """An ensemble that cannot load (a step names no model) is a failed model load:
    with the default --exit-on-error=true the server exits non-zero, as Triton 2.51
    does ("failed to load all models", checked against it), and leaves no shared
    memory behind."""
    srv = ServerProcess(BAD_ENSEMBLE, log_dir=tmp_path)
    srv.start(wait_ready=False)
    assert srv.proc.wait(120) != 0
    log = srv.log()
    assert "bad_ens" in log and "no_such_model" in log
    assert srv.segments() == []


def test_bad_ensemble_fails_alone_without_exit_on_error(tmp_path):
    """With --exit-on-error=false only the ensemble fails: the other models serve, the
    ensemble is not ready, and its requests are refused in Triton 2.51's words for a
    model that failed to load (triton_errors_2.51.json: model_not_ready), followed by
    the load error."""
    from tritonclient.utils import InferenceServerException
    srv = ServerProcess(BAD_ENSEMBLE, "--exit-on-error=false", "--strict-readiness=false",
                        log_dir=tmp_path)
    srv.start()
    try:
        for protocol in PROTOCOLS:
            c = client(srv, protocol)
            x = np.arange(4, dtype=np.float32)
            result = c.infer("identity", [infer_input(protocol, "INPUT0", x, "FP32")])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
            assert not c.is_model_ready("bad_ens")
            with pytest.raises(InferenceServerException,
                               match="Request for unknown model: 'bad_ens' has no "
                                     "available versions: .*no_such_model"):
                c.infer("bad_ens", [infer_input(protocol, "IN", x, "FP32")])
    finally:
        srv.stop_checked()
