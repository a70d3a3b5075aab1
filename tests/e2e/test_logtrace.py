"""The logging and trace extensions, end to end over HTTP and gRPC with the official
clients: settings read back as the flags set them, changes reach every process (two
frontends, the python model's worker, and a worker restarted later), malformed bodies
are refused and change nothing, and the trace file holds exactly the traced requests
in Triton's layout."""

import http.client
import json
import os
import signal

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODELS = ROOT / "tests" / "models_logtrace"
T = 30.0  # seconds any one wait may take on a loaded machine
TIMESTAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
              "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def infer(server, protocol, model, request_id):
    c = client(server, protocol)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = c.infer(model, [infer_input(protocol, "INPUT0", x, "FP32")],
                     request_id=request_id)
    assert np.array_equal(result.as_numpy("OUTPUT0"), x)


# -- logging --------------------------------------------------------------------------

FLAGS = {"log_info": True, "log_warning": False, "log_error": True, "log_verbose_level": 0,
         "log_format": "default"}


@pytest.fixture(scope="module")
def log_server(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logging")
    log_file = logs / "server.log"
    srv = ServerProcess(MODELS, "--log-file", str(log_file), "--log-warning", "false",
                        "--log-verbose", "0", frontends=2, log_dir=logs)
    srv.log_file = log_file
    yield from srv.serve()


ROLES = ("frontend[0]", "frontend[1]", "worker[log_probe")


def wait_applied(server, mark: int, verbose: int) -> None:
    """Until both frontends and the model's worker say they applied verbose level
    `verbose` (in log lines written after offset `mark`)."""
    needle = f"log settings applied: verbose level {verbose},"
    for role in ROLES:
        wait_until(lambda: any(role in line and needle in line
                               for line in log_text(server)[mark:].splitlines()),
                   T, what=f"{role} applying verbose level {verbose}")


@pytest.fixture
def logs(log_server):
    """The log server, put back to its flags' settings after each test (and every
    process has them again before the next test starts)."""
    yield log_server
    if log_settings(log_server, "http") != {"log_file": str(log_server.log_file), **FLAGS}:
        mark = len(log_text(log_server))
        client(log_server, "http").update_log_settings(dict(FLAGS))
        wait_applied(log_server, mark, FLAGS["log_verbose_level"])


def log_settings(server, protocol, update=None) -> dict:
    """GET (update None) or POST the log settings; the answer as a plain dict."""
    c = client(server, protocol)
    if protocol == "http":
        return c.update_log_settings(update) if update is not None else c.get_log_settings()
    r = c.update_log_settings(update) if update is not None else c.get_log_settings()
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.settings.items()}


def log_text(server) -> str:
    return server.log_file.read_text(errors="replace")


def wait_for_line(server, needle: str) -> str:
    return wait_until(lambda: needle in log_text(server) and log_text(server), T,
                      what=f"{needle!r} in the log file")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_get_returns_the_flags(logs, protocol):
    """GET /v2/logging and gRPC LogSettings answer the command line's values."""
    assert log_settings(logs, protocol) == {"log_file": str(logs.log_file), **FLAGS}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_post_reaches_every_process(logs, protocol):
    """Raising log_verbose_level through one frontend applies it in the scheduler, both
    frontends and the model's worker: the python model's verbose line shows in
    --log-file only after the change, and every process logs in the new format."""
    infer(logs, protocol, "log_probe", f"before-{protocol}")
    wait_for_line(logs, f"probe info line for before-{protocol}")
    assert f"probe verbose line for before-{protocol}" not in log_text(logs)
    mark = len(log_text(logs))

    answer = log_settings(logs, protocol, {"log_verbose_level": 1, "log_format": "ISO8601"})
    assert answer == {"log_file": str(logs.log_file), **FLAGS, "log_verbose_level": 1,
                      "log_format": "ISO8601"}
    wait_applied(logs, mark, 1)
    for _ in range(4):  # whichever frontend a new connection reaches answers the same
        assert log_settings(logs, "http")["log_verbose_level"] == 1
        assert log_settings(logs, "grpc")["log_format"] == "ISO8601"

    infer(logs, protocol, "log_probe", f"after-{protocol}")
    text = wait_for_line(logs, f"probe verbose line for after-{protocol}")
    line = next(l for l in text.splitlines() if f"verbose line for after-{protocol}" in l)
    assert line[:4].isdigit() and line[4] == "-" and "Z I " in line  # ISO8601 layout
    applied = [l for l in text[mark:].splitlines() if "applied: verbose level 1," in l]
    assert len(applied) >= 3 and all(l[:4].isdigit() for l in applied)  # ISO8601 too


def test_restarted_worker_gets_current_settings(logs):
    """A worker started after the change (the supervisor restarts a killed one) logs
    with the settings in force, not the command line's."""
    mark = len(log_text(logs))
    log_settings(logs, "http", {"log_verbose_level": 2})
    wait_applied(logs, mark, 2)
    text = log_text(logs)
    pids = {int(l.split()[2]) for l in text.splitlines()
            if "worker[log_probe" in l and "probe info line" in l}
    if not pids:  # no request has run yet in this module's server
        infer(logs, "http", "log_probe", "warmup")
        pids = {int(l.split()[2]) for l in wait_for_line(logs, "line for warmup").splitlines()
                if "worker[log_probe" in l and "probe info line" in l}
    os.kill(pids.pop(), signal.SIGKILL)

    def restarted():
        try:
            infer(logs, "grpc", "log_probe", "after-restart")
            return True
        except InferenceServerException:
            return False
    wait_until(restarted, T, 0.2, "the restarted log_probe instance")
    text = wait_for_line(logs, "probe verbose line for after-restart")
    line = next(l for l in text.splitlines() if "verbose line for after-restart" in l)
    assert int(line.split()[2]) not in pids


def _post(server, path: str, body: bytes, method: str = "POST"):
    conn = http.client.HTTPConnection(server.http_url, timeout=T)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


@pytest.mark.parametrize("body,status,message", [
    (b"{not json", 400, "failed to parse the logging request JSON buffer"),
    (b"[1]", 400, "expected a JSON object"),
    (b'{"log_info": "yes"}', 400, "expect boolean for 'log_info'"),
    (b'{"log_verbose_level": -1}', 400, "'log_verbose_level' must be in"),
    (b'{"log_verbose_level": 1.5}', 400, "expect unsigned integer"),
    (b'{"log_format": "json"}', 400, "invalid argument for log_format, got: json"),
    (b'{"log_file": "/tmp/elsewhere.log"}', 400,
     "log file location can not be updated through network protocol"),
    (b'{"log_verbose_level": 3, "log_error": 0}', 400, "expect boolean for 'log_error'"),
])
def test_http_malformed_logging_body(logs, body, status, message):
    """A malformed POST /v2/logging is a 400 with Triton's {"error"} and changes
    nothing, not even the good values beside the bad one."""
    before = log_settings(logs, "http")
    code, answer = _post(logs, "/v2/logging", body)
    assert code == status and message in answer["error"]
    assert log_settings(logs, "http") == before
    assert _post(logs, "/v2/logging", b"", "PUT")[0] == 405


def _raw_log_settings(server, **values):
    """A LogSettings call with exactly these SettingValue fields (the official client
    cannot send a wrong type)."""
    request = service_pb2.LogSettingsRequest()
    for name, (field, value) in values.items():
        setattr(request.settings[name], field, value)
    with grpc.insecure_channel(server.grpc_url) as channel:
        return service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(
            request, timeout=T)


@pytest.mark.parametrize("values,code,message", [
    ({"log_info": ("string_param", "yes")}, grpc.StatusCode.INVALID_ARGUMENT,
     "expect boolean for 'log_info'"),
    ({"log_verbose_level": ("bool_param", True)}, grpc.StatusCode.INVALID_ARGUMENT,
     "expect unsigned integer for 'log_verbose_level'"),
    ({"log_format": ("string_param", "json")}, grpc.StatusCode.INVALID_ARGUMENT,
     "invalid argument for log_format, got: json"),
    ({"log_file": ("string_param", "/tmp/x.log")}, grpc.StatusCode.UNIMPLEMENTED,
     "log file location can not be updated"),
])
def test_grpc_malformed_log_settings(logs, values, code, message):
    """A malformed LogSettings call fails with the gRPC status of Triton's error class
    and changes nothing."""
    before = log_settings(logs, "grpc")
    with pytest.raises(grpc.RpcError) as e:
        _raw_log_settings(logs, **values)
    assert e.value.code() == code and message in e.value.details()
    assert log_settings(logs, "grpc") == before


# -- trace ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    trace_file = d / "trace.json"
    # count=0: nothing is traced until a test asks for a number of traces
    srv = ServerProcess(MODELS, "--trace-config", f"triton,file={trace_file}",
                        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                        "--trace-config", "count=0", frontends=2, log_dir=d)
    srv.trace_file = trace_file
    yield from srv.serve()


def trace_settings(server, protocol, model="", update=None) -> dict:
    c = client(server, protocol)
    if update is None:
        r = c.get_trace_settings(model_name=model or None)
    else:
        r = c.update_trace_settings(model_name=model or None, settings=update)
    if protocol == "http":
        return r
    return {k: (list(v.value) if k == "trace_level" else v.value[0])
            for k, v in r.settings.items()}


def indexed_files(server) -> set[str]:
    d = server.trace_file.parent
    return {n for n in os.listdir(d) if n.startswith(server.trace_file.name + ".")}


def new_traces(server, before: set[str]) -> list[list[dict]]:
    """The traces in the one indexed file written since `before`, each a list of its
    records in file order."""
    new = wait_until(lambda: indexed_files(server) - before, T, what="a new trace file")
    assert len(new) == 1, new
    records = json.loads((server.trace_file.parent / new.pop()).read_text())
    traces: dict[int, list[dict]] = {}
    for r in records:
        traces.setdefault(r["id"], []).append(r)
    return list(traces.values())


def check_trace(records: list[dict], model: str) -> str:
    """Triton's TIMESTAMPS layout: the model record, then one record per timestamp, in
    order, with non-decreasing times. Returns the request id."""
    head, *stamps = records
    assert head["model_name"] == model and head["model_version"] == 1
    assert [s["timestamps"][0]["name"] for s in stamps] == TIMESTAMPS
    ns = [s["timestamps"][0]["ns"] for s in stamps]
    assert ns == sorted(ns) and ns[0] > 0
    assert all(set(s) == {"id", "timestamps"} for s in stamps)
    return head["request_id"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_get_trace_settings_returns_the_flags(trace_server, protocol):
    s = trace_settings(trace_server, protocol)
    assert s["trace_level"] == ["TIMESTAMPS"] and s["trace_rate"] == "1"
    assert s["trace_file"] == str(trace_server.trace_file)
    assert s["log_frequency"] == "0" and s["trace_mode"] == "triton"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_file_holds_exactly_count_traces(trace_server, protocol):
    """rate=1, count=3: the first three requests are traced, no more; once counted
    traces are collected they are written to the next <trace_file>.<k>, and the count
    reads back as 0."""
    before = indexed_files(trace_server)
    assert trace_settings(trace_server, protocol, update={"trace_count": "3"})[
        "trace_count"] == "3"
    ids = [f"{protocol}-{i}" for i in range(5)]
    for rid in ids:
        infer(trace_server, protocol, "log_probe", rid)
    traces = new_traces(trace_server, before)
    assert [check_trace(t, "log_probe") for t in traces] == ids[:3]
    assert len({t[0]["id"] for t in traces}) == 3
    assert trace_settings(trace_server, protocol)["trace_count"] == "0"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_setting_overrides_global(trace_server, protocol):
    """A model's trace setting overrides the global one for that model only; the
    fields it does not set follow the global ones; null clears it back."""
    before = indexed_files(trace_server)
    trace_settings(trace_server, protocol, update={"trace_count": "0"})
    try:
        s = trace_settings(trace_server, protocol, "trace_probe", {"trace_count": "2"})
        assert s["trace_count"] == "2" and s["trace_rate"] == "1"
        assert trace_settings(trace_server, protocol)["trace_count"] == "0"
        for i in range(3):
            infer(trace_server, protocol, "log_probe", f"global-{protocol}-{i}")
            infer(trace_server, protocol, "trace_probe", f"model-{protocol}-{i}")
        traces = new_traces(trace_server, before)
        assert [check_trace(t, "trace_probe") for t in traces] == [
            f"model-{protocol}-0", f"model-{protocol}-1"]
    finally:
        trace_settings(trace_server, protocol, "trace_probe", {"trace_count": None})
    assert trace_settings(trace_server, protocol, "trace_probe") == trace_settings(
        trace_server, protocol)


@pytest.mark.parametrize("body,path,status,message", [
    (b"{oops", "/v2/trace/setting", 400, "failed to parse the trace request JSON buffer"),
    (b'{"trace_rate": 5}', "/v2/trace/setting", 400, "expect a string for 'trace_rate'"),
    (b'{"trace_rate": "five"}', "/v2/trace/setting", 400,
     "Unable to parse 'trace_rate', got: five"),
    (b'{"trace_count": "-9"}', "/v2/trace/setting", 400, "Expecting value >= -1"),
    (b'{"trace_level": ["OFF", "TIMESTAMPS"]}', "/v2/trace/setting", 400,
     "Expect only one trace level 'OFF' is specified"),
    (b'{"trace_file": "/tmp/t.json"}', "/v2/trace/setting", 400,
     "trace file location can not be updated through network protocol"),
    (b'{"trace_rate": "0"}', "/v2/trace/setting", 400,
     "Attempting to set invalid trace setting :sample rate must be non-zero"),
    (b'{"trace_rate": "2"}', "/v2/models/nope/trace/setting", 400,
     "Request for unknown model : nope"),
])
def test_http_malformed_trace_body(trace_server, body, path, status, message):
    """A malformed trace setting POST is a 400 with {"error"} and changes nothing."""
    before = trace_settings(trace_server, "http")
    code, answer = _post(trace_server, path, body)
    assert code == status and message in answer["error"]
    assert trace_settings(trace_server, "http") == before


@pytest.mark.parametrize("update,model,message", [
    ({"trace_rate": ["1", "2"]}, "", "expect only 1 value for 'trace_rate'"),
    ({"trace_count": "many"}, "", "Unable to parse 'trace_count', got: many"),
    ({"trace_level": ["LOUD"]}, "", "invalid trace level 'LOUD'"),
    ({"trace_rate": "2"}, "nope", "Request for unknown model : nope"),
])
def test_grpc_malformed_trace_setting(trace_server, update, model, message):
    """The same through gRPC TraceSetting: INVALID_ARGUMENT, nothing changed."""
    before = trace_settings(trace_server, "grpc")
    with pytest.raises(InferenceServerException) as e:
        trace_settings(trace_server, "grpc", model, update)
    assert "INVALID_ARGUMENT" in str(e.value.status()) and message in e.value.message()
    assert trace_settings(trace_server, "grpc") == before
