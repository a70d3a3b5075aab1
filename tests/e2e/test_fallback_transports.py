"""The fallback transports a user can still choose (--grpc-frontend grpcio,
--http-frontend uvicorn) serve a real server: health, inference on both protocols, a
stream and an error in each protocol's own form. One short pass in place of the second
run of whole e2e modules on each fallback (scripts/test): the servicer, the HTTP app
and the data plane are the same objects on either transport, and the unit tests cover
what differs (TLS on grpc.aio in test_grpc_tls, the ASGI infer path in
test_http_server and test_body_budget)."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.harness import EXAMPLES, MODELS, ROOT, ServerProcess
from tests.e2e.test_streams import check_grpc_error_mode

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    # models_decoupled for slow_identity, which answers a negative input with an error
    srv = ServerProcess((EXAMPLES, MODELS, ROOT / "tests" / "models_decoupled"),
                        log_dir=tmp_path_factory.mktemp("logs"))
    srv.argv += ["--grpc-frontend", "grpcio", "--http-frontend", "uvicorn"]
    srv.start()
    yield srv
    srv.stop_checked()


def _x():
    return np.random.default_rng(3).standard_normal((1, 16), dtype=np.float32)


def test_uvicorn_serves_health_inference_and_errors(fallback):
    with httpclient.InferenceServerClient(fallback.http_url) as c:
        assert c.is_server_live() and c.is_server_ready()
        x = _x()
        i = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("identity_fp32", [i]).as_numpy("OUTPUT0"), x)
        with pytest.raises(InferenceServerException) as e:
            c.infer("no_such_model", [i])
        assert e.value.status() == "404"
        assert "Request for unknown model" in e.value.message()


def test_grpcio_serves_health_inference_stream_and_errors(fallback):
    with grpcclient.InferenceServerClient(fallback.grpc_url) as c:
        assert c.is_server_live() and c.is_server_ready()
        x = _x()
        i = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("identity_fp32", [i]).as_numpy("OUTPUT0"), x)
        with pytest.raises(InferenceServerException) as e:
            c.infer("no_such_model", [i])
        assert e.value.status() == "StatusCode.NOT_FOUND"
        results: queue.Queue = queue.Queue()
        c.start_stream(lambda result, error: results.put((result, error)))
        try:
            c.async_stream_infer("identity_fp32", [i], request_id="s1")
            result, error = results.get(timeout=30)
        finally:
            c.stop_stream()
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_grpcio_ends_a_triton_grpc_error_stream_at_the_first_error(fallback):
    check_grpc_error_mode(fallback.grpc_url)
