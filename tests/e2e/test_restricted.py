"""Restricted API groups, the HTTP input size limit and client shared memory switched
off, end to end with tritonclient over HTTP and gRPC against a real server. The
expected words and codes were checked against tritonserver 2.51 (restrictions) and
Triton's sources (the input limit and --allow-client-shm are newer than 2.51)."""

import http.client
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from frontend import grpc_health
from tests.e2e import clients
from tests.e2e.harness import EXAMPLES, ServerProcess

pytestmark = pytest.mark.e2e

ADMIN = {"admin-key": "s3cret"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}
USER = {"user-key": "u"}
GRPC_USER = {"triton-grpc-protocol-user-key": "u"}
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # inference restricted for one key, admin groups for another, as Triton's docs show
    s = ServerProcess(EXAMPLES,
                      "--http-restricted-api",
                      "model-config,model-repository,shared-memory,statistics:admin-key=s3cret",
                      "--http-restricted-api", "inference:user-key=u",
                      "--grpc-restricted-protocol",
                      "model-config,model-repository,shared-memory,statistics,health:"
                      "admin-key=s3cret",
                      "--grpc-restricted-protocol", "inference:user-key=u",
                      "--http-max-input-size", str(LIMIT),
                      log_dir=tmp_path_factory.mktemp("restricted"))
    yield from s.serve()


def _infer(protocol, c, headers=None, n=4):
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    # a copy: tritonclient.http adds its own headers to the dict it is given
    r = c.infer("identity_fp32", [clients.infer_input(protocol, "INPUT0", x, "FP32")],
                headers=dict(headers) if headers else None)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def _refused(protocol, call, header):
    with pytest.raises(InferenceServerException) as e:
        call()
    if protocol == "http":
        assert e.value.status() == "403"
        assert e.value.message() == f"This API is restricted, expecting header '{header}'"
    else:
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        assert e.value.message() == ("This protocol is restricted, expecting header "
                                     f"'triton-grpc-protocol-{header}'")


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_restricted_groups_need_their_header(srv, protocol):
    """Rule: each restricted group answers only with its own header and value (HTTP
    403, gRPC UNAVAILABLE, Triton's words); unrestricted groups stay open."""
    c = clients.client(srv, protocol)
    admin = ADMIN if protocol == "http" else GRPC_ADMIN
    user = USER if protocol == "http" else GRPC_USER
    _refused(protocol, lambda: c.get_model_config("identity_fp32"), "admin-key")
    _refused(protocol, lambda: c.get_model_config("identity_fp32", headers=user),
             "admin-key")
    _refused(protocol, lambda: c.get_model_config(
        "identity_fp32", headers={k: "wrong" for k in admin}), "admin-key")
    assert c.get_model_config("identity_fp32", headers=admin)
    _refused(protocol, lambda: c.get_inference_statistics("identity_fp32"), "admin-key")
    assert c.get_inference_statistics("identity_fp32", headers=admin)
    _refused(protocol, lambda: c.get_system_shared_memory_status(), "admin-key")
    # the repository API is in the table whoever serves it
    _refused(protocol, lambda: c.get_model_repository_index(), "admin-key")
    _refused(protocol, lambda: _infer(protocol, c), "user-key")
    _refused(protocol, lambda: _infer(protocol, c, admin), "user-key")
    _infer(protocol, c, user)
    assert c.get_model_metadata("identity_fp32")  # metadata: not restricted
    assert c.get_server_metadata()
    if protocol == "http":
        assert c.is_server_live() and c.is_model_ready("identity_fp32")
    else:
        _refused(protocol, lambda: c.is_server_live(), "admin-key")
        assert c.is_server_ready(headers=admin)


def test_grpc_stream_and_health_service_are_restricted(srv):
    """Rule: ModelStreamInfer is 'inference' and grpc.health.v1.Health/Check is
    'health' (as in Triton): refused without the metadata, served with it."""
    import queue
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    x = np.ones((1, 4), np.float32)
    inp = clients.infer_input("grpc", "INPUT0", x, "FP32")
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        c.async_stream_infer("identity_fp32", [inp])
    except InferenceServerException:
        pass  # the stream was refused at its start, before this request (as Triton)
    result, error = got.get(timeout=60)
    assert result is None and "This protocol is restricted, expecting header " \
        "'triton-grpc-protocol-user-key'" in str(error)
    c.stop_stream()
    c.start_stream(callback=lambda result, error: got.put((result, error)),
                   headers=GRPC_USER)
    c.async_stream_infer("identity_fp32", [inp])
    result, error = got.get(timeout=60)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    c.stop_stream()
    with grpc.insecure_channel(srv.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as e:
            check(grpc_health.encode_request(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "triton-grpc-protocol-admin-key" in e.value.details()
        reply = check(grpc_health.encode_request(), timeout=30,
                      metadata=tuple(GRPC_ADMIN.items()))
        assert grpc_health.decode_response(reply) == 1  # SERVING
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
        with pytest.raises(grpc.RpcError) as e:
            next(iter(watch(grpc_health.encode_request(), timeout=30)))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        stream = watch(grpc_health.encode_request(), timeout=30,
                       metadata=tuple(GRPC_ADMIN.items()))
        assert grpc_health.decode_response(next(iter(stream))) == 1
        stream.cancel()


def _post(srv, path, body_parts, headers, chunked=False):
    """A raw HTTP POST; the body is sent part by part and sending stops as soon as
    the server has answered (it must answer without reading the rest)."""
    conn = http.client.HTTPConnection(srv.http_url.split(":")[0], srv.http_port,
                                      timeout=60)
    conn.putrequest("POST", path)
    for k, v in headers.items():
        conn.putheader(k, v)
    if chunked:
        conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    sent = 0
    try:
        for part in body_parts:
            conn.send(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            sent += len(part)
        if chunked:
            conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed: what a refusal does
    response = conn.getresponse()
    out = response.status, json.loads(response.read() or b"{}")
    conn.close()
    return out, sent


def test_declared_length_over_the_limit_is_refused_before_the_body(srv):
    """Rule: a Content-Length over --http-max-input-size is answered 400 with Triton's
    words without the body being sent (the server does not wait for it), whatever the
    route, and a lying Content-Length cannot get it to read more."""
    path = "/v2/models/identity_fp32/infer"
    headers = {"Content-Length": str(10 * LIMIT), **USER}
    (status, body), sent = _post(srv, path, [], headers)
    assert status == 400 and sent == 0
    assert body["error"] == (f"request JSON size of {10 * LIMIT} bytes exceeds the maximum "
                             f"allowed input size of {LIMIT} bytes. Use "
                             "--http-max-input-size to increase the limit.")
    (status, body), _ = _post(srv, path, [], {**headers,
                                             "Inference-Header-Content-Length": "0"})
    assert status == 400 and body["error"].startswith(
        f"Raw input has a byte_size ({10 * LIMIT} bytes)")
    (status, body), _ = _post(srv, "/v2/logging", [], {"Content-Length": str(LIMIT + 1)})
    assert status == 400 and "exceeds the maximum allowed input size" in body["error"]
    _infer("http", clients.HttpClient(srv.http_url), USER)


@pytest.mark.parametrize("route", ["/v2/models/identity_fp32/infer", "/v2/logging"])
def test_chunked_body_over_the_limit_is_cut_off(srv, route):
    """Rule: a chunked body (no Content-Length) is refused once it passes the limit;
    the server stays up and serves the next request."""
    parts = [b" " * 4096] * (4 * LIMIT // 4096)
    (status, body), _ = _post(srv, route, parts, {**USER, **ADMIN}, chunked=True)
    assert status == 400 and "exceeds the maximum allowed input size" in body["error"]
    _infer("http", clients.HttpClient(srv.http_url), USER)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_under_the_limit_is_served_and_grpc_has_no_such_limit(srv, protocol):
    """Rule: a request under the limit is served; --http-max-input-size is HTTP's only
    (Triton has no gRPC input size flag: its messages may be up to 2 GiB)."""
    c = clients.client(srv, protocol)
    user = USER if protocol == "http" else GRPC_USER
    _infer(protocol, c, user, n=LIMIT // 8)
    if protocol == "grpc":
        _infer(protocol, c, user, n=LIMIT)  # 4x the HTTP limit
    else:
        with pytest.raises(InferenceServerException, match="exceeds the maximum allowed"):
            _infer(protocol, c, user, n=LIMIT)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_client_shm_off_by_default_in_tritons_words(srv, protocol):
    """Rule: without --allow-client-shm, register and unregister are refused with
    Triton's UNSUPPORTED and its words; status still answers (empty)."""
    c = clients.client(srv, protocol)
    admin = ADMIN if protocol == "http" else GRPC_ADMIN
    message = ("Client shared memory is disabled. Start the server with "
               "'--allow-client-shm=true' to enable.")
    code = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
    for call in (lambda: c.register_system_shared_memory("r", "/shm_x", 64, headers=admin),
                 lambda: c.unregister_system_shared_memory("r", headers=admin)):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert (e.value.status(), e.value.message()) == (code, message)
    status = c.get_system_shared_memory_status(headers=admin)
    assert not (status if protocol == "http" else status.regions)


def test_content_length_shorter_than_the_body_does_not_smuggle_a_request(srv):
    """Rule: a Content-Length that understates the body cannot smuggle the rest in as
    a request of its own: the connection is answered 400 (the declared bytes are no
    JSON request, the rest is no HTTP) and closed; the server stays up."""
    import socket
    body = b'{"inputs": []}' + b"x" * LIMIT
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
                     b"user-key: u\r\nContent-Length: 10\r\n\r\n" + body)
        got = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    assert got.startswith(b"HTTP/1.1 400")
    assert got.count(b"HTTP/1.1 ") <= 2  # the answer, and at most a 400 for the rest
    assert b"HTTP/1.1 200" not in got
    _infer("http", clients.HttpClient(srv.http_url), USER)
