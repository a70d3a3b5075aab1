"""frontend.http_server: every endpoint over a fake DataPlane, through the native
HTTP/1.1 transport that production runs (in memory), and once more over a real socket
with tritonclient.http. The ASGI interface alone (asgi_call) is what uvicorn drives."""

import asyncio
import gzip
import json
import socket
import threading
import time

import httptools
import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from frontend import http_codec, inflate
from frontend.http_server import make_http_app
from frontend.transport import http1
from frontend.types import InferResult, ModelView, OutputTensor
from frontend.validate import validate_request
from scripts.attack_wire import gzip_of_zeros  # built, not deflated: ~0.3 s less
from shm.errors import ErrorCode, InferError
from tests.unit.fake_dataplane import FakeDataPlane

IDENTITY = text_format.Parse("""
name: "identity" backend: "python" max_batch_size: 8
input [
  {name: "INPUT0" data_type: TYPE_FP32 dims: [16]},
  {name: "INPUT1" data_type: TYPE_STRING dims: [-1] optional: true}
]
output [
  {name: "OUTPUT0" data_type: TYPE_FP32 dims: [16]},
  {name: "OUTPUT1" data_type: TYPE_STRING dims: [-1]}
]
""", model_config_pb2.ModelConfig())

PLAIN = text_format.Parse("""
name: "plain" platform: "onnxruntime_onnx"
input [{name: "INPUT0" data_type: TYPE_INT32 dims: [2, 2]}]
output [{name: "OUTPUT0" data_type: TYPE_INT32 dims: [2, 2]}]
""", model_config_pb2.ModelConfig())


class FakeCore(FakeDataPlane):
    """An identity model: returns each INPUTn as OUTPUTn. `plain` has versions 1
    (ready) and 2 (unavailable); `loading` has no ready version."""

    def __init__(self):
        self.live = True
        self.ready = True
        self.released = 0
        self.fail_with = None
        self.models = {
            "identity": [ModelView("identity", 1, "READY", "", IDENTITY,
                                   labels={"OUTPUT0": [f"c{i}" for i in range(16)]})],
            "plain": [ModelView("plain", 1, "READY", "", PLAIN,
                                config_json={"name": "plain", "from": "config_json"}),
                      ModelView("plain", 2, "UNAVAILABLE", "failed", PLAIN)],
            "loading": [ModelView("loading", 1, "LOADING", "", PLAIN)],
        }

    def server_live(self):
        return self.live

    def server_ready(self):
        return self.ready

    def model_versions(self, name):
        return self.models.get(name, [])

    def get_model(self, name, version=""):
        views = self.models.get(name)
        if not views:
            raise InferError(ErrorCode.NOT_FOUND,
                             f"Request for unknown model: '{name}' is not found")
        if not version:
            ready = [v for v in views if v.state == "READY"]
            return ready[-1] if ready else views[-1]
        for view in views:
            if view.version == int(version):
                return view
        raise InferError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' "
                         f"version {version} is not found")

    async def infer(self, request, decoupled_refusal=""):
        if self.fail_with is not None:
            raise self.fail_with
        view = self.get_model(request.model_name, request.model_version)
        if view.state != "READY":
            raise InferError(ErrorCode.UNAVAILABLE, f"Request for unknown model: "
                             f"'{view.name}' has no available versions")
        validate_request(request, view.config)
        outputs = [OutputTensor(i.name.replace("INPUT", "OUTPUT"), i.datatype, i.shape,
                                i.data) for i in request.inputs]

        def release():
            self.released += 1

        return InferResult(view.name, str(view.version), request.id, outputs, release)


def call(app, method, path, body=b"", headers=()):
    """One request through the native HTTP/1.1 transport (transport/http1.py, what
    production runs), over an in-memory connection; returns (status, {header: value},
    body)."""
    return asyncio.run(acall(app, method, path, body, headers))


class _Wire(asyncio.Transport):
    """The server's end of one connection, in memory: what it writes is parsed as an
    HTTP/1.1 response; `answered` is done once one is whole."""

    def __init__(self):
        super().__init__()
        self.answered = asyncio.get_running_loop().create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.headers, self.body, self.closed = {}, bytearray(), False

    # what the server writes
    def write(self, data):
        self.parser.feed_data(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    abort = close

    def can_write_eof(self):
        return False

    def pause_reading(self):
        pass

    resume_reading = pause_reading

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 80)}.get(
            name, default)

    # the response parser's callbacks
    def on_header(self, name, value):
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, data):
        self.body += data

    def on_message_complete(self):
        if not self.answered.done():
            self.answered.set_result(self.parser.get_status_code())


async def acall(app, method, path, body=b"", headers=()):
    """call(), on the running loop."""
    wire = _Wire()
    conn = http1.HttpProtocol(app, set())
    conn.connection_made(wire)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers)
    conn.data_received(f"{method} {path} HTTP/1.1\r\nhost: test\r\n{head}"
                       f"content-length: {len(body)}\r\n\r\n".encode())
    # the body arrives in two reads when it is long, as from a real socket
    half = len(body) // 2 if len(body) > 64 else len(body)
    for piece in (body[:half], body[half:]):
        if piece:
            conn.data_received(piece)
    try:
        status = await asyncio.wait_for(wire.answered, 10)
    finally:
        conn.connection_lost(None)
    out = bytes(wire.body)
    if "content-length" in wire.headers:
        assert int(wire.headers["content-length"]) == len(out)
    return status, wire.headers, out


def asgi_call(app, method, path, body=b"", headers=()):
    """One request through the app's ASGI interface, as uvicorn (--http-frontend
    uvicorn) drives it."""
    return asyncio.run(_asgi_call(app, method, path, body, headers))


async def _asgi_call(app, method, path, body=b"", headers=()):
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "server": ("test", 80),
        "client": ("test", 1),
        "headers": [(k.lower().encode(), str(v).encode()) for k, v in headers]
        + [(b"content-length", str(len(body)).encode())],
    }
    # the body arrives in two messages when it is long, as from a real socket
    half = len(body) // 2 if len(body) > 64 else len(body)
    messages = [{"type": "http.request", "body": body[:half], "more_body": half < len(body)}]
    if half < len(body):
        messages.append({"type": "http.request", "body": body[half:], "more_body": False})
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    out = b"".join(m.get("body", b"") for m in sent[1:])
    head = {k.decode(): v.decode() for k, v in start["headers"]}
    if "content-length" in head:
        assert int(head["content-length"]) == len(out)
    return start["status"], head, out


@pytest.fixture
def core():
    return FakeCore()


@pytest.fixture
def app(core):
    return make_http_app(core, server_version="9.9", extensions=["binary_tensor_data"])


def infer_body(binary=True, outputs=None, batch=1, **kwargs):
    data = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    inp = httpclient.InferInput("INPUT0", [batch, 16], "FP32")
    inp.set_data_from_numpy(data, binary_data=binary)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        [inp], outputs=outputs, **kwargs)
    headers = [] if header_length is None else [
        ("Inference-Header-Content-Length", header_length)]
    return data, body, headers


def client_result(head, body):
    length = head.get("inference-header-content-length")
    return httpclient.InferResult.from_response_body(
        body, header_length=None if length is None else int(length))


def error(status_head_body):
    status, head, body = status_head_body
    assert head["content-type"] == "application/json"
    return status, json.loads(body)["error"]


# ------------------------------------------------------------------ health, metadata


def test_health(app, core):
    assert call(app, "GET", "/v2/health/live")[::2] == (200, b"")
    assert call(app, "GET", "/v2/health/ready")[::2] == (200, b"")
    core.live = core.ready = False
    assert call(app, "GET", "/v2/health/live")[::2] == (400, b"")
    assert call(app, "GET", "/v2/health/ready")[::2] == (400, b"")


def test_server_metadata(app):
    status, head, body = call(app, "GET", "/v2")
    assert status == 200 and head["content-type"] == "application/json"
    assert json.loads(body) == {"name": "shmserve", "version": "9.9",
                                "extensions": ["binary_tensor_data"]}


def test_model_metadata(app):
    status, _, body = call(app, "GET", "/v2/models/identity")
    assert status == 200
    assert json.loads(body) == {
        "name": "identity", "versions": ["1"], "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                   {"name": "INPUT1", "datatype": "BYTES", "shape": [-1, -1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                    {"name": "OUTPUT1", "datatype": "BYTES", "shape": [-1, -1]}]}
    status, _, body = call(app, "GET", "/v2/models/plain/versions/1")
    meta = json.loads(body)
    assert status == 200 and meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 2]}]


def test_model_metadata_errors(app):
    assert error(call(app, "GET", "/v2/models/nope")) == (
        404, "Request for unknown model: 'nope' is not found")
    assert error(call(app, "GET", "/v2/models/plain/versions/7"))[0] == 404
    assert error(call(app, "GET", "/v2/models/plain/versions/2")) == (
        503, "Request for unknown model: 'plain' version 2 is not at ready state")
    assert error(call(app, "GET", "/v2/models/loading")) == (
        404, "Request for unknown model: 'loading' has no available versions")
    assert error(call(app, "GET", "/v2/models/plain/versions/x"))[0] == 400


def test_model_ready(app):
    assert call(app, "GET", "/v2/models/identity/ready")[::2] == (200, b"")
    assert call(app, "GET", "/v2/models/plain/versions/1/ready")[0] == 200
    for path in ("/v2/models/plain/versions/2/ready", "/v2/models/nope/ready",
                 "/v2/models/loading/ready"):
        assert error(call(app, "GET", path)) == (400, "Model version not ready")


def test_model_config(app):
    status, _, body = call(app, "GET", "/v2/models/plain/config")
    assert status == 200 and json.loads(body) == {"name": "plain",
                                                  "from": "config_json"}
    status, _, body = call(app, "GET", "/v2/models/identity/versions/1/config")
    config = json.loads(body)
    assert status == 200 and config["name"] == "identity"
    assert config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert error(call(app, "GET", "/v2/models/nope/config"))[0] == 404


def test_infer_route_without_the_fast_path(app, core):
    # the same endpoint is registered as a plain route for paths the fast path skips
    from starlette.applications import Starlette

    data, body, headers = infer_body()
    status, head, out = asgi_call(Starlette(routes=app.routes), "POST",
                                  "/v2/models/identity/versions/1/infer", body, headers)
    assert status == 200
    np.testing.assert_array_equal(client_result(head, out).as_numpy("OUTPUT0"), data)


def test_method_not_allowed(app):
    """Rule: a route without the method is 405 with its Allow header and Triton's
    JSON body, {"error": "Method Not Allowed"}."""
    for method, path, allow in (("GET", "/v2/models/identity/infer", {"POST"}),
                                ("POST", "/v2/health/live", {"GET", "HEAD"})):
        status, head, body = call(app, method, path)
        assert status == 405
        assert set(head["allow"].split(", ")) == allow
        assert head["content-type"] == "application/json"
        assert json.loads(body) == {"error": "Method Not Allowed"}


@pytest.mark.parametrize("method,path", [
    ("GET", "/foo"), ("POST", "/foo"), ("GET", "/v2/foo"),
    ("GET", "/v2/models/identity/bogus"), ("GET", "/v2/models/identity/versions/1/xyz"),
    ("DELETE", "/")])
def test_unknown_route_is_a_json_404(app, method, path):
    """Rule (issue 26, 7): a path no route serves gets Triton 2.51's answer, 404 with
    the body {"error": "Not Found"} (checked on the real server for these paths), as
    JSON, so a client that parses every error body does not choke on plain text."""
    status, head, body = call(app, method, path)
    assert status == 404
    assert head["content-type"] == "application/json"
    assert json.loads(body) == {"error": "Not Found"}


# --------------------------------------------------------------------------- infer


def test_infer_binary_roundtrip_with_tritonclient_codec(app, core):
    data, body, headers = infer_body(binary=True, request_id="abc")
    status, head, out = call(app, "POST", "/v2/models/identity/infer", body, headers)
    assert status == 200
    assert head["content-type"] == "application/octet-stream"
    result = client_result(head, out)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    assert result.get_response()["id"] == "abc"
    assert result.get_response()["model_version"] == "1"
    assert core.released == 1


def test_infer_json_roundtrip(app, core):
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    data, body, headers = infer_body(binary=False, outputs=outputs, batch=2)
    assert headers == []
    status, head, out = call(app, "POST", "/v2/models/identity/versions/1/infer", body)
    assert status == 200 and head["content-type"] == "application/json"
    assert "inference-header-content-length" not in head
    np.testing.assert_array_equal(client_result(head, out).as_numpy("OUTPUT0"), data)
    assert json.loads(out)["outputs"][0]["data"] == data.ravel().tolist()


def test_infer_bytes_input(app):
    text = np.array([["ab", "cd", "ü"]], dtype=object)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 3], "BYTES")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), np.float32))
    inputs[1].set_data_from_numpy(text)
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs)
    status, head, out = call(app, "POST", "/v2/models/identity/infer", body,
                             [("Inference-Header-Content-Length", length)])
    assert status == 200
    got = client_result(head, out).as_numpy("OUTPUT1")
    assert got.tolist() == [[b"ab", b"cd", "ü".encode()]]


def test_infer_classification(app):
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False,
                                               class_count=2)]
    _, body, headers = infer_body(outputs=outputs)
    status, head, out = call(app, "POST", "/v2/models/identity/infer", body, headers)
    assert status == 200
    (output,) = json.loads(out)["outputs"]
    assert output["shape"] == [1, 2]
    assert output["data"] == ["15.000000:15:c15", "14.000000:14:c14"]


def test_infer_gzip_request_and_response(app):
    data, body, headers = infer_body()
    status, head, out = call(
        app, "POST", "/v2/models/identity/infer", gzip.compress(body),
        headers + [("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip")])
    assert status == 200 and head["content-encoding"] == "gzip"
    np.testing.assert_array_equal(
        client_result(head, gzip.decompress(out)).as_numpy("OUTPUT0"), data)
    status, head, out = call(app, "POST", "/v2/models/identity/infer", body,
                             headers + [("Content-Encoding", "br")])
    # Triton 2.51: 501 Not Implemented, with the encodings it takes
    assert status == 501 and head["accept-encoding"] == "gzip, deflate"
    assert json.loads(out) == {"error": "Unsupported compression type"}


def test_a_gzip_bomb_is_capped_and_inflates_in_steps(core):
    """16 MiB of zeros in 16 KiB of gzip, under a 12 MiB --http-max-input-size: a 400
    once 12 MiB are out, inflated a step at a time (inflate.STEP, 4 MiB) so that a
    request sent meanwhile on the same loop is answered first. (Small sizes: the
    steps and the cap are what is tested, and each MiB inflated costs CPU.)"""
    cap = 12 << 20
    app = make_http_app(core, max_input_size=cap)
    bomb = gzip_of_zeros(16 << 20)
    assert cap >= 3 * inflate.STEP
    done = []

    async def both():
        async def one(name, *args):
            result = await acall(app, *args)
            done.append(name)
            return result
        return await asyncio.gather(
            one("bomb", "POST", "/v2/models/identity/infer", bomb,
                [("Content-Encoding", "gzip")]),
            one("live", "GET", "/v2/health/live"))

    start = time.process_time()
    bombed, live = asyncio.run(both())
    assert error(bombed) == (400, "Decompressed data size exceeds the maximum allowed "
                                  f"value of {cap} bytes. Use --http-max-input-size "
                                  "to increase the limit.")
    assert live[0] == 200 and done == ["live", "bomb"]
    assert time.process_time() - start < 5.0  # generous: ~0.15 s of inflate here


def test_infer_raw_binary_request(app, core):
    core.models["raw"] = [ModelView("raw", 1, "READY", "", text_format.Parse(
        'name: "raw" max_batch_size: 2 input [{name: "INPUT0" data_type: TYPE_INT32 '
        'dims: [-1]}] output [{name: "OUTPUT0" data_type: TYPE_INT32 dims: [-1]}]',
        model_config_pb2.ModelConfig()))]
    raw = np.arange(5, dtype=np.int32)
    status, head, out = call(app, "POST", "/v2/models/raw/infer", raw.tobytes(),
                             [("Inference-Header-Content-Length", 0)])
    assert status == 200
    np.testing.assert_array_equal(client_result(head, out).as_numpy("OUTPUT0"),
                                  raw.reshape(1, 5))


@pytest.mark.parametrize("body, headers, message", [
    (b"{oops", [], "failed to parse the request JSON buffer"),
    (b'{"inputs": []}xx', [("Inference-Header-Content-Length", 14)],
     "unexpected additional input data for model 'identity'"),
    (b'{"inputs": []}', [("Inference-Header-Content-Length", 99)],
     "inference header size should be in range (0, 14), got: 99"),
])
def test_infer_bad_framing_is_400(app, core, body, headers, message):
    status, text = error(call(app, "POST", "/v2/models/identity/infer", body, headers))
    assert status == 400 and message in text
    assert core.released == 0


def test_infer_truncated_binary_is_400(app):
    _, body, headers = infer_body()
    status, text = error(call(app, "POST", "/v2/models/identity/infer", body[:-8],
                              headers))
    assert (status, text) == (400, "unexpected size for input 'INPUT0', expecting 8 "
                                   "additional bytes for model 'identity'")


def test_infer_validation_errors_are_400(app):
    _, body, headers = infer_body(batch=9)
    status, text = error(call(app, "POST", "/v2/models/identity/infer", body, headers))
    assert (status, text) == (400, "[request id: <id_unknown>] inference request "
                                   "batch-size must be <= 8 for 'identity'")
    bad_shape = {"inputs": [{"name": "INPUT0", "shape": [1, 17], "datatype": "FP32",
                             "data": [0.0] * 17}]}
    status, text = error(call(app, "POST", "/v2/models/identity/infer",
                              json.dumps(bad_shape).encode()))
    assert status == 400 and "Expected [-1,16], got [1,17]" in text
    outputs = [httpclient.InferRequestedOutput("NOPE")]
    _, body, headers = infer_body(outputs=outputs)
    status, text = error(call(app, "POST", "/v2/models/identity/infer", body, headers))
    assert status == 400 and "unexpected inference output 'NOPE'" in text


def test_infer_unknown_and_unavailable_models(app):
    _, body, headers = infer_body()
    status, text = error(call(app, "POST", "/v2/models/nope/infer", body, headers))
    assert (status, text) == (404, "Request for unknown model: 'nope' is not found")
    status, _ = error(call(app, "POST", "/v2/models/identity/versions/3/infer", body,
                           headers))
    assert status == 404
    status, _ = error(call(app, "POST", "/v2/models/loading/infer", body, headers))
    assert status == 503


def test_infer_unexpected_failure_is_500_and_result_released(app, core):
    core.fail_with = RuntimeError("worker died")
    _, body, headers = infer_body()
    assert error(call(app, "POST", "/v2/models/identity/infer", body, headers)) == (
        500, "RuntimeError: worker died")
    core.fail_with = None
    # an encoding failure after inference still releases the result
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", class_count=1)]
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), np.float32))
    inputs[1].set_data_from_numpy(np.array([[b"x"]], dtype=object))
    body, length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs)
    status, text = error(call(app, "POST", "/v2/models/identity/infer", body,
                              [("Inference-Header-Content-Length", length)]))
    assert status == 400 and "class result not available" in text
    assert core.released == 1


# ------------------------------------------------------ a real socket, tritonclient


@pytest.fixture
def served(app):
    """The app on the native HTTP/1.1 transport, on a loopback socket."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(http1.serve(app, sock), loop).result(10)
    yield "127.0.0.1:%d" % sock.getsockname()[1]
    asyncio.run_coroutine_threadsafe(server.stop(1.0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_tritonclient_http_end_to_end(served):
    client = httpclient.InferenceServerClient(served)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("identity")
        assert not client.is_model_ready("nope")
        assert client.get_server_metadata()["name"] == "shmserve"
        assert client.get_model_metadata("identity")["inputs"][0]["shape"] == [-1, 16]
        assert client.get_model_config("plain")["from"] == "config_json"

        data = np.random.rand(2, 16).astype(np.float32)
        text = np.array([[b"a", b"bc"], [b"", b"\xff"]], dtype=object)
        inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"),
                  httpclient.InferInput("INPUT1", [2, 2], "BYTES")]
        for binary in (True, False):
            inputs[0].set_data_from_numpy(data, binary_data=binary)
            inputs[1].set_data_from_numpy(text, binary_data=True)
            result = client.infer("identity", inputs, request_id="7")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
            assert result.as_numpy("OUTPUT1").tolist() == text.tolist()
            assert result.get_response()["id"] == "7"
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        result = client.infer("identity", inputs, outputs=outputs,
                              request_compression_algorithm="deflate",
                              response_compression_algorithm="gzip")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)

        with pytest.raises(InferenceServerException) as info:
            client.infer("nope", inputs)
        assert info.value.status() == "404"
        assert "Request for unknown model" in info.value.message()
        inputs[0] = httpclient.InferInput("INPUT0", [2, 8], "FP32")
        inputs[0].set_data_from_numpy(data[:, :8].copy())
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity", inputs)
        assert info.value.status() == "400"
        assert "unexpected shape for input 'INPUT0'" in info.value.message()
    finally:
        client.close()


def test_codec_module_uses_a_fast_json(app):
    # msgspec is installed with the project; the json fallback is only for its absence
    assert http_codec.json_dumps({"a": [1]}) == b'{"a":[1]}'


# ------------------------------------------------------------------ deep JSON


class EveryCallCore(FakeCore):
    """FakeCore with the control calls every route makes, answering plainly."""

    async def shm_call(self, *args, **kwargs):
        return []

    async def log_settings(self, update=None):
        from shm.messages.settings import LogSettings
        return LogSettings()

    async def trace_settings(self, model="", update=None):
        return {}

    async def repository_index(self, ready=False):
        return []

    async def repository_load(self, name, config=None, files=None):
        return None

    async def repository_unload(self, name, unload_dependents=False):
        return None


def _deep(depth: int, kind: str) -> str:
    return '{"a":' * depth + "1" + "}" * depth if kind == "object" else \
        "[" * depth + "]" * depth


# the routes that read a JSON body (every other POST route ignores its body)
JSON_ROUTES = {"/infer", "/generate", "/generate_stream", "/infer_stream", "/register",
               "/v2/logging", "/trace/setting", "/v2/repository/index", "/load",
               "/unload"}


@pytest.mark.parametrize("depth", [1100, 100_000])
@pytest.mark.parametrize("kind", ["object", "array"])
def test_json_nested_past_the_parser_is_a_400_on_every_route(depth, kind):
    """JSON nested deeper than the parser's stack (~1000 levels) raised RecursionError,
    which repository load, shm register and the settings and generate routes answered
    with a 500 (or not at all). Every route: never a 5xx; those that read JSON, a 400
    with {"error": ...}. (Triton's rapidjson parses any depth and ignores what it does
    not know: it answers 200 for a load whose body is one deep unknown member.)"""
    app = make_http_app(EveryCallCore())
    deep = _deep(depth, kind)
    bodies = [deep, '{"parameters": %s}' % deep, '{"inputs": %s}' % deep]
    json_routes = 0
    for route in app.routes:
        path = (route.path.replace("{model_name}", "identity").replace("{version}", "1")
                .replace("{name}", "region"))
        if "POST" not in (route.methods or ()):
            continue
        for body in bodies:
            status, head, out = call(app, "POST", path, body.encode(),
                                     [("content-type", "application/json")])
            assert status < 500, (route.path, status, out[:200])
            if any(route.path.endswith(r) for r in JSON_ROUTES):
                assert status == 400, (route.path, status, out[:200])
                assert error((status, head, out))[1]
        json_routes += any(route.path.endswith(r) for r in JSON_ROUTES)
    assert json_routes >= 15  # the model routes twice (with and without a version)
