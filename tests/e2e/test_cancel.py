"""Request cancellation end to end (Triton's python backend README, "Request
Cancellation Handling"; qa/L0_request_cancellation): a client's gRPC cancel drops a
request still queued, and reaches a running one inside its model, where
`request.is_cancelled()` turns true. What the model saw is read back through a later
request, never guessed from timing."""

import queue
import json
import re
import socket
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cancel_server(tmp_path_factory):
    srv = ServerProcess(ROOT / "tests" / "models_bls", "--model-control-mode=explicit",
                        "--load-model=cancel_watch", "--load-model=cancel_stream",
                        log_dir=tmp_path_factory.mktemp("cancel-logs"))
    yield from srv.serve()


def mode_input(mode: str):
    inp = grpcclient.InferInput("MODE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    return inp


def pending(server) -> int:
    """Triton's nv_inference_pending_request_count for cancel_watch: requests queued,
    not running."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    m = re.search(r'nv_inference_pending_request_count\{model="cancel_watch",'
                  r'version="1"\} (\d+)', text)
    return int(m.group(1)) if m else -1


def report(c) -> str:
    return c.infer("cancel_watch", [mode_input("report")]).as_numpy("LAST")[0].decode()


def test_grpc_cancel_drops_queued_and_reaches_running_request(cancel_server, tmp_path):
    """Rules: (1) a cancelled request that is still queued is dropped: the model never
    runs it; (2) a cancelled request that is running is told: the scheduler forwards the
    cancel to the worker running it and request.is_cancelled() turns true in the model,
    which then ends early; (3) the server keeps serving."""
    c = grpcclient.InferenceServerClient(cancel_server.grpc_url)
    assert report(c) == "none records=0"
    marker = tmp_path / "started"
    done_a: queue.Queue = queue.Queue()
    done_b: queue.Queue = queue.Queue()
    running = c.async_infer("cancel_watch", [mode_input("wait")],
                            lambda result, error: done_a.put(error),
                            parameters={"marker": str(marker)})
    wait_until(marker.exists, 60, what="the model to start the request")
    queued = c.async_infer("cancel_watch", [mode_input("record")],
                           lambda result, error: done_b.put(error))
    wait_until(lambda: pending(cancel_server) == 1, 30, what="the second request queued")

    queued.cancel()
    assert "CANCELLED" in str(done_b.get(timeout=30).status())
    wait_until(lambda: pending(cancel_server) == 0, 30, what="the queued request dropped")

    running.cancel()
    assert "CANCELLED" in str(done_a.get(timeout=30).status())
    # queued behind the cancelled request: runs once the model has seen the cancel
    # (without it, the model would wait 60 s and report "timed out")
    assert report(c) == "cancelled records=0"
    # the model still serves, and a request that is not cancelled runs
    c.infer("cancel_watch", [mode_input("record")])
    assert report(c) == "cancelled records=1"



def test_dropped_http_client_reaches_its_running_request(cancel_server, tmp_path):
    """Rule: an HTTP client that disconnects while its request runs cancels it inside
    the model too: request.is_cancelled() turns true there (the frontend notices the
    closed connection, the scheduler forwards the cancel to the worker)."""
    c = grpcclient.InferenceServerClient(cancel_server.grpc_url)
    c.infer("cancel_watch", [mode_input("reset")])
    assert report(c).startswith("none")
    marker = tmp_path / "started"
    body = json.dumps({
        "inputs": [{"name": "MODE", "datatype": "BYTES", "shape": [1], "data": ["wait"]}],
        "parameters": {"marker": str(marker)}}).encode()
    s = socket.create_connection(("127.0.0.1", cancel_server.http_port), timeout=30)
    try:
        s.sendall(b"POST /v2/models/cancel_watch/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        wait_until(marker.exists, 60, what="the model to start the request")
    finally:
        s.close()  # the client goes away mid-request
    # queued behind the running request: answers once the model has seen the cancel
    # (without it the model would wait 60 s and report "timed out")
    assert report(c).startswith("cancelled")


def _stream_report(url: str) -> str:
    c = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        c.async_stream_infer("cancel_stream", [mode_input("report")])
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            last = result.as_numpy("LAST")
            if last is not None:
                return last[0].decode()
    finally:
        c.stop_stream()


def test_cancelled_stream_reaches_a_decoupled_request_after_execute_returned(
        cancel_server):
    """Rule: a decoupled request keeps running after its execute returned (its batch is
    done); a cancel of its stream still reaches the worker running it, and
    response_sender.is_cancelled() turns true there."""
    c = grpcclient.InferenceServerClient(cancel_server.grpc_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    c.async_stream_infer("cancel_stream", [mode_input("stream")])
    result, error = results.get(timeout=30)  # streaming: execute has returned
    assert error is None, error
    c.stop_stream(cancel_requests=True)
    # poll what the model saw, up to a deadline (it notices at its next send)
    wait_until(lambda: _stream_report(cancel_server.grpc_url) != "running", 30,
               what="the model to end its stream")
    assert _stream_report(cancel_server.grpc_url) == "cancelled"
