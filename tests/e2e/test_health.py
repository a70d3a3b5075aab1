"""Honest health: --strict-readiness, the grpc.health.v1 service, a port taken by
another server, and model errors that say where they came from (issue 11, part 8)."""

from __future__ import annotations

import re
import shutil
import signal
import time

import grpc
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from frontend import grpc_health
from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import EXAMPLES, ServerProcess, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IO = ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
      'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
CRASHING = ("class TritonPythonModel:\n"
            "    def initialize(self, args):\n"
            "        raise RuntimeError('cannot open weights file')\n")
EXEC_ERROR = ("class TritonPythonModel:\n"
              "    def execute(self, requests):\n"
              "        x = 1\n"
              "        raise ValueError('bad input ' + str(x))\n")


def _python_model(repo, name: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 0\n{IO}')
    (repo / name / "1" / "model.py").write_text(code)


def _repo(tmp_path, crashing: bool):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    _python_model(repo, "exec_error", EXEC_ERROR)
    if crashing:
        _python_model(repo, "crashing", CRASHING)
    return repo


def _health_check(srv) -> int:
    with grpc.insecure_channel(srv.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=None, response_deserializer=None)
        return grpc_health.decode_response(check(grpc_health.encode_request(), timeout=10))


def _x(protocol):
    return [infer_input(protocol, "X", np.ones(1, np.float32), "FP32")]


def _add_sub(srv, protocol):
    c = client(srv, protocol)
    a = np.arange(16, dtype=np.float32)
    result = c.infer("add_sub", [infer_input(protocol, "INPUT0", a, "FP32"),
                                 infer_input(protocol, "INPUT1", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.fixture(scope="module")
def failed_load_server(tmp_path_factory):
    """A server whose model 'crashing' raises in initialize(), default readiness."""
    tmp = tmp_path_factory.mktemp("health_strict")
    srv = ServerProcess(_repo(tmp, crashing=True), "--exit-on-error=false", log_dir=tmp)
    srv.start(wait_ready=False)
    try:
        # up: the frontends answer once every model load has ended (failed or not)
        wait_until(lambda: srv.proc.poll() is not None or _live(srv), 120,
                   what="the server to be live")
        assert srv.proc.poll() is None, srv.log()
        yield srv
    finally:
        srv.stop_checked()


def _live(srv) -> bool:
    try:
        return client(srv, "http").is_server_live()
    except Exception:
        return False


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_strict_readiness_not_ready_while_a_model_failed(failed_load_server, protocol):
    """Rule (--strict-readiness, default true, as Triton's IsReady): the server answers
    not ready while a model failed to load, though it is live and serves the others."""
    c = client(failed_load_server, protocol)
    assert c.is_server_live()
    assert c.is_model_ready("add_sub") and not c.is_model_ready("crashing")
    assert not c.is_server_ready()
    _add_sub(failed_load_server, protocol)


def test_grpc_health_not_serving_while_a_model_failed(failed_load_server):
    """Rule: grpc.health.v1.Health/Check follows readiness: NOT_SERVING here."""
    assert _health_check(failed_load_server) == grpc_health.NOT_SERVING


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_initialize_error_names_model_type_and_line(failed_load_server, protocol):
    """Rule: an exception in initialize() reaches the client asking for the model and
    the log with its type, its text and the model.py line, in Triton's wording."""
    c = client(failed_load_server, protocol)
    with pytest.raises(InferenceServerException) as exc:
        c.infer("crashing", _x(protocol))
    message = exc.value.message()
    assert "RuntimeError: cannot open weights file" in message
    assert "crashing/1/model.py(3): initialize" in message
    log = failed_load_server.log()
    assert "failed to load 'crashing' version 1: RuntimeError: cannot open" in log
    assert "crashing/1/model.py(3): initialize" in log
    # the startup load table carries the reason, its frames on rows of their own
    table_row = next(line for line in log.splitlines()
                     if line.startswith("| crashing") or "| crashing " in line)
    assert "UNAVAILABLE: RuntimeError: cannot open weights file" in table_row


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_execute_error_names_instance_type_and_line(failed_load_server, protocol):
    """Rule: an exception in execute() fails the request with Triton's python-backend
    wording: the model instance, the exception type and text, and the model.py line;
    the log says the same, and the model keeps serving."""
    c = client(failed_load_server, protocol)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as exc:
            c.infer("exec_error", _x(protocol))
        message = exc.value.message()
        assert message.startswith("Failed to process the request(s) for model "
                                  "'exec_error_0"), message
        assert "message: ValueError: bad input 1" in message
        assert "exec_error/1/model.py(4): execute" in message
    assert "exec_error/1/model.py(4): execute" in failed_load_server.log()


@pytest.fixture(scope="module")
def lenient_server(tmp_path_factory):
    """The same failing repository with --strict-readiness=false, a Triton-only flag
    that does not apply, and a server id."""
    tmp = tmp_path_factory.mktemp("health_lenient")
    srv = ServerProcess(_repo(tmp, crashing=True), "--exit-on-error=false",
                        "--strict-readiness=false", "--backend-directory", "/nowhere",
                        "--id", "edge-7", log_dir=tmp, frontends=2)
    yield from srv.serve()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_readiness_not_strict_is_ready_once_up(lenient_server, protocol):
    """Rule: with --strict-readiness=false the server is ready once it is up, even
    with a model that failed to load; gRPC health answers SERVING."""
    c = client(lenient_server, protocol)
    assert not c.is_model_ready("crashing")
    assert c.is_server_ready()
    assert _health_check(lenient_server) == grpc_health.SERVING


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_id_names_the_server(lenient_server, protocol):
    """Rule: --id is the name in the server metadata, as tritonserver's."""
    metadata = client(lenient_server, protocol).get_server_metadata()
    name = metadata["name"] if protocol == "http" else metadata.name
    assert name == "edge-7"


def test_ignored_triton_flag_warns_once(lenient_server):
    """Rule: a tritonserver flag without effect here is accepted with one warning."""
    assert lenient_server.log().count("--backend-directory is ignored") == 1


def test_strict_readiness_ready_when_all_models_load(tmp_path):
    """Rule: with every model loaded the strict server is ready (HTTP, gRPC, gRPC
    health SERVING). Also: a second server on its HTTP port fails at once naming the
    port, and the first, with two frontends sharing its ports, keeps serving."""
    first = ServerProcess(_repo(tmp_path, crashing=False), log_dir=tmp_path, frontends=2)
    first.start()
    try:
        for protocol in PROTOCOLS:
            assert client(first, protocol).is_server_ready()
        assert _health_check(first) == grpc_health.SERVING

        second = ServerProcess(_repo(tmp_path / "b", crashing=False),
                               "--http-port", str(first.http_port), log_dir=tmp_path)
        started = time.monotonic()
        second.start(wait_ready=False)
        try:
            code = second.proc.wait(60)
        finally:
            second.stop()
        assert code != 0
        # it fails before loading any model: seconds, not a model load
        assert time.monotonic() - started < 30
        log = second.log()
        assert f"port {first.http_port} (--http-port)" in log, log
        assert "already in use" in log
        assert second.segments() == []
        for _ in range(8):  # connections spread over both frontends, all answered
            for protocol in PROTOCOLS:
                _add_sub(first, protocol)
        assert _health_check(first) == grpc_health.SERVING
    finally:
        first.stop_checked()


def _lines(log: str, letter: str) -> list[str]:
    """The records of one level (Triton's first letter: W, E), without the lines
    that continue a record (a reason's "At:" frames)."""
    return [line for line in log.splitlines() if re.match(letter + r"\d{4} ", line)]


def test_clean_stop_and_failed_load_log_no_warning(tmp_path):
    """Rule (issue 26, 7): normal events do not look like faults. A model that fails
    to load logs its reason in one error record (its type, text and model.py line; no
    traceback of ours, also where our code found the fault, or before any load);
    serving requests and a clean stop (SIGTERM) log no warning and no error at all
    (operators alert on them), with workers and frontends stopping together."""
    repo = _repo(tmp_path, crashing=True)
    (repo / "no_file" / "1").mkdir(parents=True)  # fails in our code, not the model's
    (repo / "no_file" / "config.pbtxt").write_text(f'backend: "python"\n{IO}')
    (repo / "bad_config" / "1").mkdir(parents=True)  # refused before any load
    (repo / "bad_config" / "config.pbtxt").write_text('backend: "python"\nbogus: 1\n')
    srv = ServerProcess(repo, "--exit-on-error=false", "--strict-readiness=false",
                        log_dir=tmp_path, frontends=2)
    srv.start()
    try:
        for _ in range(3):
            for protocol in PROTOCOLS:
                _add_sub(srv, protocol)
    finally:
        assert srv.stop(signal.SIGTERM) == 0, srv.log()
    log = srv.log()
    assert "server stopped" in log, log
    assert _lines(log, "W") == [], log
    errors = sorted(_lines(log, "E"), key=lambda line: ("'no_file'" in line) + 2 * (
        "'bad_config'" in line))
    assert len(errors) == 3, log
    assert ("failed to load 'crashing' version 1: RuntimeError: cannot open weights "
            "file") in errors[0]
    assert "failed to load 'no_file' version 1: python model file not found" in errors[1]
    assert ("Poll failed for model directory 'bad_config': failed to parse model "
            "configuration") in errors[2]
    assert "crashing/1/model.py(3): initialize" in log
    assert "Traceback" not in log, log


def test_second_server_on_the_grpc_port_fails_too(tmp_path):
    """Rule: the gRPC port is claimed the same way: a second server on it exits
    non-zero with the port in its message."""
    first = ServerProcess(_repo(tmp_path, crashing=False), log_dir=tmp_path)
    first.start()
    try:
        second = ServerProcess(_repo(tmp_path / "b", crashing=False),
                               "--grpc-port", str(first.grpc_port), log_dir=tmp_path)
        second.start(wait_ready=False)
        try:
            code = second.proc.wait(60)
        finally:
            second.stop()
        assert code != 0
        assert f"port {first.grpc_port} (--grpc-port)" in second.log()
        _add_sub(first, "grpc")
    finally:
        first.stop_checked()


def test_two_servers_started_at_once_exactly_one_serves(tmp_path):
    """Rule: the port check is race-free: of two servers started together on the same
    ports, exactly one serves and the other exits non-zero naming a port."""
    a = ServerProcess(_repo(tmp_path / "a", crashing=False), log_dir=tmp_path / "a")
    b = ServerProcess(_repo(tmp_path / "b", crashing=False),
                      "--http-port", str(a.http_port), "--grpc-port", str(a.grpc_port),
                      "--metrics-port", str(a.metrics_port), log_dir=tmp_path / "b")
    b.http_port, b.grpc_port, b.metrics_port = a.http_port, a.grpc_port, a.metrics_port
    a.start(wait_ready=False)
    b.start(wait_ready=False)
    try:
        loser = wait_until(lambda: next((s for s in (a, b) if s.proc.poll() is not None),
                                        None), 60, what="one server to exit")
        winner = b if loser is a else a
        assert loser.proc.returncode != 0
        assert f"port {a.http_port} (--http-port)" in loser.log() or \
            f"port {a.grpc_port} (--grpc-port)" in loser.log() or \
            f"port {a.metrics_port} (--metrics-port)" in loser.log(), loser.log()
        wait_until(winner._ready_or_dead, 120, 0.1, "the other server to be ready")
        assert winner.proc.poll() is None, winner.log()
        for protocol in PROTOCOLS:
            _add_sub(winner, protocol)
        assert loser.segments() == []
    finally:
        for srv in (a, b):
            if srv.proc.poll() is None:
                srv.stop_checked()
            else:
                srv.stop()
