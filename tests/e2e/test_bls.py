"""BLS (business logic scripting) end to end: python models calling other models with
`pb_utils.InferenceRequest(...).exec()` / `async_exec()` through the scheduler, and the
errors a model raises reaching the client with the status its TritonError code maps to
(Triton's python backend README: "Business Logic Scripting", "Error Handling")."""

import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from shm.errors import ErrorCode
from tests import onnx_models
from tests.e2e.clients import PROTOCOLS, client, infer_input, requested
from tests.e2e.harness import ROOT, ServerProcess

pytestmark = pytest.mark.e2e

BLS_REPO = ROOT / "tests" / "models_bls"
ONNX_CONFIG = """
name: "onnx_identity"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def onnx_repo(root):
    onnx_models.identity(root / "onnx_identity", dims=("n",), config=ONNX_CONFIG)
    return root


@pytest.fixture(scope="module")
def bls_server(tmp_path_factory):
    repo = onnx_repo(tmp_path_factory.mktemp("bls-onnx"))
    srv = ServerProcess([BLS_REPO, repo], frontends=1,
                        log_dir=tmp_path_factory.mktemp("bls-logs"))
    yield from srv.serve()


def call(server, protocol, model, x, parameters=None, output="OUTPUT0"):
    inputs = [infer_input(protocol, "INPUT0", x, "FP32")]
    return client(server, protocol).infer(model, inputs, outputs=[requested(protocol, output)],
                                          parameters=parameters).as_numpy(output)


def status_of(exc: InferenceServerException, protocol: str):
    """The HTTP status or gRPC code name a failed call came back with."""
    status = exc.status()
    if protocol == "grpc":
        return str(status).replace("StatusCode.", "")
    return int(status) if status is not None else None


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("target", ["py_identity", "onnx_identity"])
def test_sync_bls_reaches_python_and_onnx_models(bls_server, protocol, target):
    """Rule: exec() runs a request on any loaded model, python or onnxruntime, through
    the scheduler, and returns its outputs; request.parameters() carries the client's
    request parameters into the model."""
    x = np.arange(12, dtype=np.float32).reshape(1, 12) + (1 if protocol == "http" else 2)
    y = call(bls_server, protocol, "bls_caller", x, {"target": target})
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_chain_through_two_python_models(bls_server, protocol):
    """Rule: a model reached by BLS may itself call another model (bls_caller ->
    bls_relay -> onnx_identity): each waiting execute receives its answer while it
    waits."""
    x = np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 100)
    y = call(bls_server, protocol, "bls_caller", x, {"target": "bls_relay",
                                                     "then": "onnx_identity"})
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_execute_gathers_async_exec_calls(bls_server, protocol):
    """Rule: `async def execute` runs on the worker's event loop, where
    asyncio.gather of several async_exec() calls runs them at the same time."""
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    y = call(bls_server, protocol, "bls_async", x)
    np.testing.assert_array_equal(y, 2 * x)



@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_to_a_decoupled_model_iterates_its_responses(bls_server, protocol):
    """Rule: exec(decoupled=True) returns an iterator of the decoupled model's responses
    in order, the last one final (here the empty one its send(None, FINAL) makes)."""
    c = client(bls_server, protocol)
    n = 5
    r = c.infer("bls_decoupled", [infer_input(protocol, "IN", np.array([n], np.int32),
                                              "INT32")])
    np.testing.assert_array_equal(r.as_numpy("OUT"), np.arange(n, dtype=np.int32))
    assert r.as_numpy("COUNT")[0] == n + 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_to_an_unknown_model_is_a_clear_error(bls_server, protocol):
    """Rule: a BLS call to a model that is not loaded answers with an error response in
    Triton's words (the model passes it on to its client, INTERNAL as in Triton 2.51)
    instead of hanging; the server keeps serving."""
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as err:
        call(bls_server, protocol, "bls_caller", x, {"target": "no_such_model"})
    assert err.value.message() == (
        "Model no_such_model - Error when running inference: Failed for execute the "
        "inference request. Model 'no_such_model' is not ready.")
    assert status_of(err.value, protocol) == (500 if protocol == "http" else "INTERNAL")
    np.testing.assert_array_equal(call(bls_server, protocol, "bls_caller", x), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("chain", [{"target": "bls_caller"},
                                   {"target": "bls_relay", "then": "bls_caller"}])
def test_bls_to_itself_or_in_a_cycle_fails_without_deadlock(bls_server, protocol, chain):
    """Rule: a BLS call into a model whose execute is already waiting up the call
    chain (itself, or a cycle through another model) would wait for itself: it fails
    with an error naming the chain, and the models go on serving."""
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as err:
        call(bls_server, protocol, "bls_caller", x, chain)
    message = err.value.message()
    assert "would wait for itself" in message, message
    expected = "bls_caller -> bls_caller" if "then" not in chain else \
        "bls_caller -> bls_relay -> bls_caller"
    assert expected in message, message
    np.testing.assert_array_equal(call(bls_server, protocol, "bls_caller", x), x)
    np.testing.assert_array_equal(
        call(bls_server, protocol, "bls_caller", x, {"target": "bls_relay"}), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_into_an_ensemble_carries_the_call_chain(bls_server, protocol):
    """Rule: an ensemble reached by BLS runs its steps (one of them a BLS model), and a
    step that would call back into a waiting model closes a cycle: refused, the
    ensemble fails naming its step, the server keeps serving."""
    x = np.full((1, 6), 5, np.float32)
    y = call(bls_server, protocol, "bls_relay", x, {"target": "ens_back",
                                                    "then": "py_identity"})
    np.testing.assert_array_equal(y, x)
    with pytest.raises(InferenceServerException) as err:
        call(bls_server, protocol, "bls_caller", x, {"target": "ens_back",
                                                     "then": "py_identity"})
    assert "bls_caller -> bls_caller" in err.value.message(), err.value.message()
    np.testing.assert_array_equal(call(bls_server, protocol, "bls_caller", x), x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_request_that_does_not_fit_the_callee_is_refused(bls_server, protocol):
    """Rule: a BLS request gets the checks Triton runs on every request: here a batch
    larger than the callee's max_batch_size."""
    x = np.ones((9, 4), np.float32)  # py_identity: max_batch_size 8
    with pytest.raises(InferenceServerException) as err:
        call(bls_server, protocol, "bls_caller", x)
    assert err.value.message() == (
        "Model py_identity - Error when running inference: [request id: <id_unknown>] "
        "inference request batch-size must be <= 8 for 'py_identity'")


# What the real Triton 2.51 answers when a python model's response carries each
# TritonError code (measured with scripts/compare's anchor): HTTP status, gRPC code.
TRITON_STATUS = {
    ErrorCode.UNKNOWN: (400, "UNKNOWN"),
    ErrorCode.INTERNAL: (500, "INTERNAL"),
    ErrorCode.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorCode.INVALID_ARG: (400, "INVALID_ARGUMENT"),
    ErrorCode.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorCode.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorCode.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    ErrorCode.CANCELLED: (400, "CANCELLED"),
}
CASES = [pytest.param(protocol, code, id=f"{code.name}-{protocol}")
         for code in ErrorCode for protocol in PROTOCOLS]


@pytest.mark.parametrize("protocol,code", CASES)
def test_triton_error_code_maps_to_the_protocol_status(bls_server, protocol, code):
    """Rule: an InferenceResponse error with a TritonError code reaches the client with
    its message and the HTTP status / gRPC code the real Triton answers for it."""
    c = client(bls_server, protocol)
    with pytest.raises(InferenceServerException) as err:
        c.infer("error_model", [infer_input(protocol, "CODE", np.array([int(code)], np.int32),
                                            "INT32")])
    assert err.value.message().endswith(f"error_model failed with code {int(code)}")
    http, grpc = TRITON_STATUS[code]
    assert status_of(err.value, protocol) == (http if protocol == "http" else grpc)


def _counts(server, model: str) -> dict:
    m, = client(server, "http").get_inference_statistics(model)["model_stats"]
    return {"inference": m["inference_count"], "execution": m["execution_count"],
            **{k: m["inference_stats"][k]["count"] for k in ("success", "fail", "queue",
                                                             "compute_infer")}}


def test_error_response_counts_as_a_success_in_statistics(bls_server):
    """Rule (issue 26, 8): a python model that answers with InferenceResponse(error=...)
    ran: Triton 2.51 counts the request as a success, with its inference, queue and
    compute (checked on it: 2 such requests, success 2, fail 0, inference_count 2);
    clients and dashboards comparing both servers depend on it. The client still gets
    the error."""
    before = _counts(bls_server, "error_model")
    for protocol in PROTOCOLS:
        with pytest.raises(InferenceServerException):
            client(bls_server, protocol).infer("error_model", [infer_input(
                protocol, "CODE", np.array([int(ErrorCode.INVALID_ARG)], np.int32),
                "INT32")])
    after = _counts(bls_server, "error_model")
    assert {k: after[k] - before[k] for k in after} == {
        "inference": 2, "execution": 2, "success": 2, "fail": 0, "queue": 2,
        "compute_infer": 2}


def _copies(log: str, model: str) -> dict[str, int]:
    m = re.search(rf"model '{model}' version 1: .*bytes copied host=(\d+) h2d=(\d+) "
                  rf"d2h=(\d+) d2d=(\d+)", log)
    assert m, f"no summary for {model} in the log"
    return dict(zip(("host", "h2d", "d2h", "d2d"), map(int, m.groups())))


def test_bls_passes_large_tensors_by_reference(tmp_path):
    """Rule: tensors cross a BLS call by reference: the caller's input goes to the
    callee as the block it arrived in, and the callee's output is read in place from
    the callee's arena; the only copies are each model writing its own output once.
    A copy anywhere else (the input written again, the output copied out) would show
    in the copy counters the workers report."""
    repo = onnx_repo(tmp_path / "onnx")
    srv = ServerProcess([BLS_REPO, repo], "--model-control-mode=explicit",
                        "--load-model=bls_caller", "--load-model=py_identity",
                        "--load-model=onnx_identity", log_dir=tmp_path)
    srv.start()
    try:
        x = np.random.default_rng(0).random((1, 1 << 18), dtype=np.float32)  # 1 MiB
        for protocol in PROTOCOLS:
            for target in ("py_identity", "onnx_identity"):
                np.testing.assert_array_equal(
                    call(srv, protocol, "bls_caller", x, {"target": target}), x)
    finally:
        srv.stop_checked()
    log = srv.log()
    runs = 2 * len(PROTOCOLS)
    assert _copies(log, "bls_caller")["host"] == runs * x.nbytes
    assert _copies(log, "py_identity")["host"] == len(PROTOCOLS) * x.nbytes
    assert _copies(log, "onnx_identity")["host"] == len(PROTOCOLS) * x.nbytes
    # each reader released what it read: the callees' outputs (read in place by the
    # caller), the caller's outputs (by the frontend)
    assert "were never released" not in log


def test_grpc_stream_bls(bls_server):
    """Rule: a BLS model answers over the gRPC stream like any model."""
    import queue
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(bls_server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        x = np.full((1, 8), 3, np.float32)
        c.async_stream_infer("bls_caller", [infer_input("grpc", "INPUT0", x, "FP32")])
        result, error = results.get(timeout=60)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    finally:
        c.stop_stream()


def _mode(value: str):
    inp = grpcclient.InferInput("MODE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return inp


def test_decoupled_async_execute_runs_requests_concurrently(bls_server):
    """Rule: a decoupled model's `async def execute` is scheduled on the instance's
    event loop and returns at once (Triton's python backend, decoupled async execute):
    a request that waits for a later one on the same instance is answered, which
    executes run one after the other could never do. An execute that raises ends its
    requests with the error."""
    import queue
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(bls_server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        c.async_stream_infer("py_async_gate", [_mode("wait")], request_id="wait")
        c.async_stream_infer("py_async_gate", [_mode("open")], request_id="open")
        got = {}
        while len(got) < 2:
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                got[response.id] = int(result.as_numpy("OUT")[0])
        assert got == {"wait": 1, "open": 1}
        c.async_stream_infer("py_async_gate", [_mode("bad")], request_id="bad")
        result, error = results.get(timeout=30)
        assert error is not None and "unknown mode" in str(error)
    finally:
        c.stop_stream()


def _infer_outputs(server, protocol, model, x, names):
    inputs = [infer_input(protocol, "INPUT0", x, "FP32")]
    result = client(server, protocol).infer(
        model, inputs, outputs=[requested(protocol, n) for n in names])
    return [result.as_numpy(n) for n in names]


def test_an_idle_python_instance_runs_its_batch_on_the_receiving_thread(bls_server):
    """Speed (issue 12): a batch for a python instance whose thread is idle runs on
    its worker's main thread, one thread hand-over less per batch."""
    x = np.ones((2, 3), dtype=np.float32)
    for protocol in (*PROTOCOLS, *PROTOCOLS):
        [main] = _infer_outputs(bls_server, protocol, "py_thread_probe", x, ["MAIN"])
        assert main.tolist() == [[1], [1]]


def test_bls_from_threads_and_event_loops_inside_an_inline_batch(bls_server):
    """Rule: a plain execute may wait for BLS calls it makes from threads of its own
    and from an event loop it runs (asyncio.run of async_exec). The first batch of
    the idle instance runs on the worker's receiving thread (MAIN 1), so the model's
    waits receive for themselves; from then on its batches go to the instance's own
    thread (MAIN 0), which leaves the main thread receiving as before."""
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    mains = []
    for protocol in (*PROTOCOLS, *PROTOCOLS):
        out, main = _infer_outputs(bls_server, protocol, "bls_threads", x, ["OUTPUT0", "MAIN"])
        np.testing.assert_array_equal(out, 3 * x)
        mains.append(int(main[0]))
    assert mains == [1, 0, 0, 0]
