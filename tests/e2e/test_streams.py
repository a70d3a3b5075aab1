"""Response streams for every model, and cancellation from the frontend side.

- gRPC ModelStreamInfer serves non-decoupled models too: each response carries
  triton_final_response true; an error of a request that ran travels in the stream
  (error_message, with the request's id) and one refused before running does too; the
  stream stays open (Triton's qa L0_grpc stream tests).
- A request's input blocks are freed when it ends: large inputs through streams leave
  no arena block and no segment behind.
- A cancelled gRPC stream and an HTTP client that disconnects cancel their requests:
  the frontend sends CancelRequest and the scheduler drops the queued one (it never
  executes and counts as a failure), while the server keeps serving.
"""

import json
import queue
import socket
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e import clients
from tests.e2e.harness import MODELS, ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

DECOUPLED = ROOT / "tests" / "models_decoupled"
T = 60  # seconds: a bound on every wait, never a pace


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    markers = tmp_path_factory.mktemp("st-markers")
    srv = ServerProcess((DECOUPLED, MODELS), log_dir=tmp_path_factory.mktemp("st-logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    srv.start()
    yield srv
    srv.stop_checked()
    assert "arena blocks still in use" not in srv.log(), srv.log()


def _stream(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    return c, q


def _int_input(mod, name, values):
    x = np.asarray(values, dtype=np.int32)
    inp = mod.InferInput(name, list(x.shape), "INT32")
    inp.set_data_from_numpy(x)
    return inp


def test_grpc_stream_serves_non_decoupled_models_with_errors_in_band(server):
    """Rule: ModelStreamInfer works for non-decoupled models: one response per request
    with triton_final_response true; a model error and an unknown model come back as
    error_message entries; the stream goes on serving."""
    c, q = _stream(server)
    try:
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [1, 2])],
                             request_id="ok1")
        r, e = q.get(timeout=T)
        assert e is None and r.as_numpy("OUTPUT0").tolist() == [1, 2]
        resp = r.get_response()
        assert resp.id == "ok1" and resp.parameters["triton_final_response"].bool_param
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [-1])],
                             request_id="bad")
        r, e = q.get(timeout=T)
        assert r is None and "negative input" in e.message()
        c.async_stream_infer("no_such_model", [_int_input(grpcclient, "INPUT0", [1])],
                             request_id="unknown")
        r, e = q.get(timeout=T)
        assert r is None and "unknown model" in e.message()
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [3])],
                             request_id="ok2")
        r, e = q.get(timeout=T)
        assert e is None and r.as_numpy("OUTPUT0").tolist() == [3]
    finally:
        c.stop_stream()
        c.close()


def test_large_inputs_through_streams_are_freed_when_requests_end(server):
    """Rule: a request's input blocks (large inputs go to the frontend's arena) are
    freed at its final response, for decoupled and non-decoupled models alike; the
    server fixture checks at exit that no arena block is held."""
    big = np.arange(256 * 1024, dtype=np.int32)  # 1 MiB: not inline
    c, q = _stream(server)
    try:
        for i in range(3):
            c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", big)],
                                 request_id=f"big{i}")
            r, e = q.get(timeout=T)
            assert e is None and np.array_equal(r.as_numpy("OUTPUT0"), big)
            c.async_stream_infer("repeat", [_int_input(grpcclient, "IN", big[:3])],
                                 enable_empty_final_response=True)
            for _ in range(4):
                r, e = q.get(timeout=T)
                assert e is None
    finally:
        c.stop_stream()
        c.close()
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2],
                                   "data": [1, 2]}]}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/repeat/infer_stream",
                                 data=body, method="POST")
    with urllib.request.urlopen(req, timeout=T) as r:
        assert r.status == 200


def test_large_unary_grpc_inputs_in_the_arena_are_freed_on_every_outcome(server):
    """Rule: a large unary ModelInfer is received straight into the frontend's arena;
    its block is freed whether the request runs, is refused by validation, or names a
    model that does not exist (the server fixture checks at exit that none is held)."""
    big = np.arange(256 * 1024, dtype=np.int32)  # 1 MiB: over the arena threshold
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(3):
            r = c.infer("slow_identity", [_int_input(grpcclient, "INPUT0", big)])
            assert np.array_equal(r.as_numpy("OUTPUT0"), big)
        lying = _int_input(grpcclient, "INPUT0", big)
        lying._input.shape[:] = [2 * big.size]  # claims twice the bytes it carries
        with pytest.raises(InferenceServerException, match="byte size"):
            c.infer("slow_identity", [lying])
        with pytest.raises(InferenceServerException, match="unknown model"):
            c.infer("no_such_model", [_int_input(grpcclient, "INPUT0", big)])
        r = c.infer("slow_identity", [_int_input(grpcclient, "INPUT0", big[::-1].copy())])
        assert np.array_equal(r.as_numpy("OUTPUT0"), big[::-1])
    finally:
        c.close()


def _metric(server, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=T) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _counts(server, model: str) -> tuple[int, int, int]:
    s = clients.HttpClient(server.http_url).get_inference_statistics(model)
    m = s["model_stats"][0]
    inf = m["inference_stats"]
    return inf["success"]["count"], inf["fail"]["count"], m["execution_count"]


def test_cancelled_grpc_stream_drops_its_queued_request(server):
    """Rule: cancelling a gRPC stream cancels its requests: one waiting in the queue
    (behind a running one on the model's single instance) is dropped by the scheduler
    and never executes."""
    before = _counts(server, "repeat")
    c, q = _stream(server)
    c.async_stream_infer("repeat", [_int_input(grpcclient, "IN", [1, 2, 3])],
                         parameters={"delay_ms": 400}, request_id="running")
    r, e = q.get(timeout=T)  # the first response: the instance is busy now
    assert e is None
    c.async_stream_infer("repeat", [_int_input(grpcclient, "IN", [9])], request_id="queued")
    wait_until(lambda: _metric(server, "nv_inference_pending_request_count", "repeat") == 1,
               T, what="the second request to wait in the queue")
    c.stop_stream(cancel_requests=True)
    c.close()
    # the running batch finishes; the queued request failed (cancelled), never ran
    wait_until(lambda: _counts(server, "repeat")[0] == before[0] + 1
               and _counts(server, "repeat")[1] == before[1] + 1, T,
               what="the running request to end and the queued one to be dropped")
    assert _counts(server, "repeat")[2] == before[2] + 1
    assert _metric(server, "nv_inference_pending_request_count", "repeat") == 0


def _raw_post(server, path: str, body: bytes) -> socket.socket:
    """An HTTP request sent on a socket left open (the caller closes it)."""
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=T)
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body)
    return s


def _slow_body(values, delay_ms, request_id=""):
    return json.dumps({"id": request_id, "inputs": [{"name": "INPUT0", "datatype": "INT32",
                                   "shape": [len(values)], "data": values}],
                       "parameters": {"delay_ms": delay_ms}}).encode()


@pytest.mark.parametrize("route", ["infer", "infer_stream"])
def test_disconnected_http_client_drops_its_queued_request(server, route):
    """Rule: an HTTP client that disconnects while its request waits cancels it: the
    scheduler drops it from the queue; the running request is unaffected."""
    before = _counts(server, "slow_identity")
    running = _raw_post(server, "/v2/models/slow_identity/infer",
                        _slow_body([1], 1500, f"run-{route}"))
    done = threading.Event()
    answer = []

    def read_running():
        answer.append(running.recv(65536))
        done.set()

    threading.Thread(target=read_running, daemon=True).start()
    # the running one must hold the instance before the second arrives
    wait_until(lambda: (server.markers / f"started-run-{route}").exists(), T,
               what="the first request to run")
    queued = _raw_post(server, f"/v2/models/slow_identity/{route}", _slow_body([2], 0))
    wait_until(lambda: _metric(server, "nv_inference_pending_request_count",
                               "slow_identity") == 1, T, what="second to queue")
    queued.close()  # the client goes away
    assert done.wait(T) and answer[0].startswith(b"HTTP/1.1 200")
    running.close()
    # the client has its answer before the scheduler hears the batch is done (the
    # worker answers first), so the success count may trail: wait for all three
    want = (before[0] + 1, before[1] + 1, before[2] + 1)
    wait_until(lambda: _counts(server, "slow_identity") == want, T,
               what="the running request counted and the queued one dropped")
    # and the server goes on serving
    r = clients.HttpClient(server.http_url).infer(
        "slow_identity", [_int_input(httpclient, "INPUT0", [5])])
    assert r.as_numpy("OUTPUT0").tolist() == [5]


def test_stream_cancelled_mid_response_leaves_the_server_serving(server):
    """Rule (Triton's qa L0_grpc_state_cleanup): a stream cancelled while a decoupled
    model is still sending drops what still comes for it (released unread) and the
    server serves the next stream; no handler error is logged."""
    c, q = _stream(server)
    c.async_stream_infer("repeat", [_int_input(grpcclient, "IN", list(range(8)))],
                         parameters={"delay_ms": 30, "from_thread": True},
                         request_id="cut")
    r, e = q.get(timeout=T)
    assert e is None
    c.stop_stream(cancel_requests=True)
    c.close()
    c, q = _stream(server)
    try:
        c.async_stream_infer("repeat", [_int_input(grpcclient, "IN", [42])],
                             enable_empty_final_response=True)
        r, e = q.get(timeout=T)
        assert e is None and r.as_numpy("OUT").tolist() == [42]
    finally:
        c.stop_stream()
        c.close()
    assert "handler failed" not in server.log() and "Traceback" not in server.log()


def test_cancelled_unary_grpc_call_drops_its_queued_request(server):
    """Rule: a gRPC ModelInfer call the client cancels cancels its request: queued, it
    is dropped and never executes."""
    before = _counts(server, "slow_identity")
    running = _raw_post(server, "/v2/models/slow_identity/infer",
                        _slow_body([1], 1500, "run-unary"))
    try:
        wait_until(lambda: (server.markers / "started-run-unary").exists(), T,
                   what="the first request to run")
        c = grpcclient.InferenceServerClient(server.grpc_url)
        got = queue.Queue()
        call = c.async_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [2])],
                             callback=lambda result, error: got.put((result, error)))
        wait_until(lambda: _metric(server, "nv_inference_pending_request_count",
                                   "slow_identity") == 1, T, what="second to queue")
        call.cancel()
        result, error = got.get(timeout=T)
        assert result is None and "CANCELLED" in str(error.status())
        assert running.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        running.close()
    # the client has its answer before the scheduler hears the batch is done (the
    # worker answers first), so the success count may trail: wait for all three
    want = (before[0] + 1, before[1] + 1, before[2] + 1)
    wait_until(lambda: _counts(server, "slow_identity") == want, T,
               what="the running request counted and the queued one dropped")


def check_grpc_error_mode(url: str) -> None:
    """The triton_grpc_error stream header, as Triton 2.51 answers it (compared side by
    side): a request refused before it runs (unknown model) still comes back in-band;
    the first error a model answers ends the stream, its gRPC status the error's
    (INTERNAL) and its details the message; the stream takes no more requests; the
    server goes on serving. (Shared with the grpcio engine's test in
    test_fallback_transports.)"""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)),
                   headers={"triton_grpc_error": "true"})
    try:
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [1])])
        r, e = q.get(timeout=T)
        assert e is None and r.as_numpy("OUTPUT0").tolist() == [1]
        c.async_stream_infer("no_such_model", [_int_input(grpcclient, "INPUT0", [1])])
        r, e = q.get(timeout=T)
        assert r is None and e.status() is None and "unknown model" in e.message()
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [-1])],
                             request_id="bad")
        r, e = q.get(timeout=T)
        assert r is None and e.status() == "StatusCode.INTERNAL", e
        assert "negative input" in e.message()
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [2])])
    finally:
        c.stop_stream()
    c, q = _stream_at(url)
    try:
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [-1])])
        r, e = q.get(timeout=T)  # without the header: in-band, the stream open
        assert r is None and e.status() is None and "negative input" in e.message()
        c.async_stream_infer("slow_identity", [_int_input(grpcclient, "INPUT0", [3])])
        r, e = q.get(timeout=T)
        assert e is None and r.as_numpy("OUTPUT0").tolist() == [3]
    finally:
        c.stop_stream()
        c.close()


def _stream_at(url: str):
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    return c, q


def test_triton_grpc_error_header_ends_the_stream_at_the_first_error(server):
    check_grpc_error_mode(server.grpc_url)
