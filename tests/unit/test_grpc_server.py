"""frontend.grpc_server against tritonclient.grpc (sync and aio), over a fake core, on
the native transport (transport/grpc_native.py) as production serves it.

The server runs on its own event loop in a thread, on a free loopback port; the fake
core answers like an identity model (OUTPUTn = INPUTn) and records what it was given.
"""

import asyncio
import json
import queue
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from frontend.grpc_server import handler_table
from frontend.transport.engines import grpc_engine
from frontend.transport.fallbacks import server_options
from frontend.validate import check_input_byte_size
from frontend.types import InferResult, ModelView, OutputTensor
from shm.errors import ErrorCode, InferError
from tests.unit.fake_dataplane import FakeDataPlane

pytestmark = pytest.mark.timeout(60)
T = 10  # client-side timeout for every call, seconds


def identity_config(name: str, max_batch_size: int = 8) -> mc.ModelConfig:
    return mc.ModelConfig(
        name=name, backend="python", max_batch_size=max_batch_size,
        input=[mc.ModelInput(name="INPUT0", data_type=mc.TYPE_FP32, dims=[16]),
               mc.ModelInput(name="INPUT1", data_type=mc.TYPE_STRING, dims=[-1])],
        output=[mc.ModelOutput(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[16]),
                mc.ModelOutput(name="OUTPUT1", data_type=mc.TYPE_STRING, dims=[-1])],
    )


class FakeCore(FakeDataPlane):
    """An identity model per name; 'slow' sleeps for its `delay` parameter (seconds),
    'down' is loaded but unavailable, 'broken' raises a non-InferError, 'badout'
    answers with an output buffer that cannot be encoded."""

    def __init__(self):
        self.models = {
            "identity": {1: ModelView("identity", 1, "READY", "", identity_config("identity")),
                         2: ModelView("identity", 2, "READY", "", identity_config("identity"))},
            "slow": {1: ModelView("slow", 1, "READY", "", identity_config("slow"))},
            "down": {1: ModelView("down", 1, "UNAVAILABLE", "failed to load",
                                  identity_config("down"))},
            "broken": {1: ModelView("broken", 1, "READY", "", identity_config("broken", 0))},
            "badout": {1: ModelView("badout", 1, "READY", "", identity_config("badout"))},
        }
        self.requests = []
        self.released = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return True

    def get_model(self, name: str, version: str = "") -> ModelView:
        versions = self.models.get(name)
        if versions is None:
            raise InferError(ErrorCode.NOT_FOUND,
                             f"Request for unknown model: '{name}' is not found")
        if version:
            if int(version) not in versions:
                raise InferError(ErrorCode.NOT_FOUND,
                                 f"Request for unknown model: '{name}' version {version} "
                                 f"is not found")
            return versions[int(version)]
        return versions[max(versions)]

    async def model_statistics(self, name: str = "", version: str = "") -> bytes:
        if name == "nope":
            raise InferError(ErrorCode.INVALID_ARG, "requested model 'nope' is not available")
        return json.dumps({"model_stats": [{
            "name": name or "identity", "version": version or "1", "last_inference": 7,
            "inference_count": 5, "execution_count": 2,
            "inference_stats": {"success": {"count": 5, "ns": 900}},
            "response_stats": {},
            "batch_stats": [{"batch_size": 4, "compute_infer": {"count": 1, "ns": 80}}],
            "memory_usage": []}]}).encode()

    def model_versions(self, name: str) -> list[ModelView]:
        return list(self.models.get(name, {}).values())

    # the model-repository extension: calls recorded, an index of two rows
    repository_calls: list = []

    async def repository_index(self, ready: bool = False) -> list:
        from shm.messages.repository import IndexEntry
        self.repository_calls.append(("index", ready))
        rows = [IndexEntry("identity", 1, "READY"), IndexEntry("never_loaded")]
        return rows[:1] if ready else rows

    async def repository_load(self, name, config=None, files=None) -> None:
        self.repository_calls.append(("load", name, config, files))
        if name == "nosuch":
            raise InferError(ErrorCode.INTERNAL, "failed to load 'nosuch', failed to poll "
                             "from model repository")

    async def repository_unload(self, name, unload_dependents=False) -> None:
        self.repository_calls.append(("unload", name, unload_dependents))

    async def infer(self, request, decoupled_refusal="") -> InferResult:
        self.requests.append(request)
        view = self.get_model(request.model_name, request.model_version)
        if view.state != "READY":
            raise InferError(ErrorCode.UNAVAILABLE, f"model '{view.name}' is not ready")
        if view.name == "broken":
            raise RuntimeError("the fake model fell over")
        for inp in request.inputs:
            if not inp.name.startswith("INPUT"):
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"unexpected inference input '{inp.name}' for model "
                                 f"'{view.name}'")
            if inp.data is not None:  # the real core's validation checks sizes
                check_input_byte_size(inp, view.name)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if view.name == "slow":
                await asyncio.sleep(float(request.parameters.get("delay", 0)))
        finally:
            self.in_flight -= 1
        outputs = [OutputTensor("OUTPUT" + i.name[5:], i.datatype, i.shape, i.data)
                   for i in request.inputs]
        if view.name == "badout":
            outputs[0].data = object()  # not a buffer
        if request.outputs is not None:
            wanted = {o.name for o in request.outputs}
            outputs = [o for o in outputs if o.name in wanted]

        def release():
            self.released += 1

        return InferResult(view.name, str(view.version), request.id, outputs, release)

    def start(self, request):
        """The stream RPC's entry: one response, from infer()."""
        return _OneResponse(self, request)


class _OneResponse:
    def __init__(self, core, request):
        self.core, self.request = core, request
        self.view = core.get_model(request.model_name, request.model_version)

    async def next(self):
        try:
            return await self.core.infer(self.request), True
        except InferError as e:
            return e, True

    def cancel(self):
        pass


class ServerThread:
    """The servicer on the native engine, as main.py builds it, on its own loop in a
    daemon thread."""

    def __init__(self, core, address="127.0.0.1:0"):
        self.core = core
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self.call(self._start(address))

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=T)

    async def _start(self, address):
        self.server = grpc_engine("native", handler_table(self.core, server_version="9.9.9"),
                                  address, self.core)
        await self.server.start()
        return self.server.bound_port

    def stop(self):
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=T)
        self.loop.close()


@pytest.fixture(scope="module")
def server():
    srv = ServerThread(FakeCore())
    yield srv
    srv.stop()


@pytest.fixture
def core(server):
    server.core.requests.clear()
    return server.core


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def fp32_input(array, name="INPUT0"):
    i = grpcclient.InferInput(name, list(array.shape), "FP32")
    i.set_data_from_numpy(array)
    return i


def bytes_input(array, name="INPUT1"):
    i = grpcclient.InferInput(name, list(array.shape), "BYTES")
    i.set_data_from_numpy(array)
    return i


def status_of(excinfo) -> str:
    return excinfo.value.status()


# ------------------------------------------------------------------ health, metadata


def test_health(client):
    assert client.is_server_live(client_timeout=T)
    assert client.is_server_ready(client_timeout=T)
    assert client.is_model_ready("identity", client_timeout=T)
    assert client.is_model_ready("identity", "2", client_timeout=T)
    assert not client.is_model_ready("identity", "7", client_timeout=T)
    assert not client.is_model_ready("nonexistent", client_timeout=T)
    assert not client.is_model_ready("down", client_timeout=T)


def test_server_metadata(client):
    md = client.get_server_metadata(client_timeout=T)
    assert md.name == "shmserve" and md.version == "9.9.9"
    assert "classification" in md.extensions and "sequence" in md.extensions


def test_model_metadata(client):
    md = client.get_model_metadata("identity", client_timeout=T)
    assert md.name == "identity" and list(md.versions) == ["1", "2"]
    assert md.platform == "python"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "BYTES", [-1, -1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [
        ("OUTPUT0", "FP32", [-1, 16]), ("OUTPUT1", "BYTES", [-1, -1])]
    # max_batch_size 0: no batch dimension
    md = client.get_model_metadata("broken", client_timeout=T)
    assert list(md.inputs[0].shape) == [16]
    assert client.get_model_metadata("identity", "2", as_json=True,
                                     client_timeout=T)["name"] == "identity"


def test_model_config(client):
    cfg = client.get_model_config("identity", client_timeout=T).config
    assert cfg == identity_config("identity")
    as_json = client.get_model_config("identity", as_json=True, client_timeout=T)
    assert as_json["config"]["max_batch_size"] == 8


@pytest.mark.parametrize("call", ["get_model_metadata", "get_model_config"])
def test_metadata_errors(client, call):
    with pytest.raises(InferenceServerException) as e:
        getattr(client, call)("nonexistent", client_timeout=T)
    assert status_of(e) == "StatusCode.NOT_FOUND"
    assert "unknown model: 'nonexistent'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        getattr(client, call)("down", client_timeout=T)
    # Triton 2.51 (tests/data/triton_errors_2.51.json: metadata_not_ready)
    assert status_of(e) == "StatusCode.NOT_FOUND"
    assert e.value.message() == "Request for unknown model: 'down' has no available versions"
    with pytest.raises(InferenceServerException) as e:
        getattr(client, call)("down", "1", client_timeout=T)
    assert status_of(e) == "StatusCode.UNAVAILABLE"
    assert e.value.message() == ("Request for unknown model: 'down' version 1 is not at "
                                 "ready state")


def test_statistics_json_becomes_the_grpc_message(client):
    # the scheduler's JSON (Triton's HTTP form) parses into ModelStatisticsResponse
    resp = client.get_inference_statistics("identity", "1", client_timeout=T)
    m = resp.model_stats[0]
    assert (m.name, m.version, m.inference_count, m.execution_count) == ("identity", "1", 5, 2)
    assert m.inference_stats.success.count == 5 and m.inference_stats.success.ns == 900
    assert m.batch_stats[0].batch_size == 4 and m.batch_stats[0].compute_infer.ns == 80
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("nope", client_timeout=T)
    assert status_of(e) == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "requested model 'nope' is not available"


def test_repository_rpcs_carry_their_parameters(client, core):
    """Rule: RepositoryIndex lists rows as Triton (a never-loaded model by name only);
    RepositoryModelLoad passes `config` (string_param) and `file:` (bytes_param)
    parameters on; RepositoryModelUnload its `unload_dependents`; errors keep their
    code and message."""
    core.repository_calls.clear()
    index = client.get_model_repository_index(as_json=True, client_timeout=T)
    assert index == {"models": [{"name": "identity", "version": "1", "state": "READY"},
                                {"name": "never_loaded"}]}
    client.load_model("m", config='{"backend": "python"}',
                      files={"file:1/model.py": b"\x00code"}, client_timeout=T)
    client.unload_model("m", unload_dependents=True, client_timeout=T)
    assert core.repository_calls == [
        ("index", False), ("load", "m", '{"backend": "python"}', {"file:1/model.py": b"\x00code"}),
        ("unload", "m", True)]
    with pytest.raises(InferenceServerException) as e:
        client.load_model("nosuch", client_timeout=T)
    assert status_of(e) == "StatusCode.INTERNAL"
    assert e.value.message() == "failed to load 'nosuch', failed to poll from model repository"


# ------------------------------------------------------------------------ inference


def test_infer_raw(client, core):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    s = np.array([[b"one", b"two"], [b"", "\u00fcnicode".encode()]], dtype=object)
    released = core.released
    r = client.infer("identity", [fp32_input(a), bytes_input(s)], request_id="req-1",
                     client_timeout=T)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a)
    assert r.as_numpy("OUTPUT1").tolist() == s.tolist()  # BYTES round trip
    resp = r.get_response()
    assert (resp.model_name, resp.model_version, resp.id) == ("identity", "2", "req-1")
    assert core.released == released + 1
    req = core.requests[-1]
    assert req.outputs is None and req.model_version == ""


def test_infer_version_outputs_and_parameters(client, core):
    a = np.ones((1, 16), np.float32)
    s = np.array([[b"x"]], dtype=object)
    r = client.infer("identity", [fp32_input(a), bytes_input(s)], model_version="1",
                     outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
                     sequence_id="corr-7", sequence_start=True, priority=3, timeout=5000,
                     parameters={"custom": "yes", "n": 4}, client_timeout=T)
    assert r.get_response().model_version == "1"
    assert r.as_numpy("OUTPUT0") is None and r.as_numpy("OUTPUT1").tolist() == [[b"x"]]
    req = core.requests[-1]
    assert [o.name for o in req.outputs] == ["OUTPUT1"]
    assert req.parameters == {"sequence_id": "corr-7", "sequence_start": True,
                              "sequence_end": False, "priority": 3, "timeout": 5000,
                              "custom": "yes", "n": 4}
    client.infer("identity", [fp32_input(a)], sequence_id=42, client_timeout=T)
    assert core.requests[-1].parameters["sequence_id"] == 42


def test_infer_large(client):
    a = np.random.default_rng(0).random((16, 16384), dtype=np.float32)  # 1 MiB: split path
    r = client.infer("identity", [fp32_input(a)], client_timeout=T)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a)


def typed_request(**contents):
    msg = service_pb2.ModelInferRequest(model_name="identity", id="typed")
    for name, (datatype, shape, field, values) in contents.items():
        io = msg.inputs.add(name=name, datatype=datatype, shape=shape)
        getattr(io.contents, field).extend(values)
    return msg


def test_infer_typed_contents(stub):
    msg = typed_request(INPUT0=("FP32", [1, 3], "fp32_contents", [1.5, 2.5, -1]),
                        INPUT1=("BYTES", [2], "bytes_contents", [b"ab", b"c"]),
                        INPUT2=("INT8", [2], "int_contents", [-1, 7]))
    resp = stub.ModelInfer(msg, timeout=T)
    assert resp.id == "typed"
    result = grpcclient.InferResult(resp)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"),
                                  np.array([[1.5, 2.5, -1]], np.float32))
    assert result.as_numpy("OUTPUT1").tolist() == [b"ab", b"c"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT2"), np.array([-1, 7], np.int8))


def expect_error(client, status, fragment, *args, **kwargs):
    with pytest.raises(InferenceServerException) as e:
        client.infer(*args, client_timeout=T, **kwargs)
    assert status_of(e) == status, e.value
    assert fragment in e.value.message()
    return e.value


def test_infer_errors(client, core):
    a = fp32_input(np.ones((1, 16), np.float32))
    expect_error(client, "StatusCode.NOT_FOUND", "unknown model: 'nonexistent'",
                 "nonexistent", [a])
    expect_error(client, "StatusCode.UNAVAILABLE", "model 'down' is not ready", "down", [a])
    expect_error(client, "StatusCode.INVALID_ARGUMENT", "unexpected inference input 'BAD'",
                 "identity", [fp32_input(np.ones((1, 16), np.float32), "BAD")])
    expect_error(client, "StatusCode.INTERNAL", "the fake model fell over", "broken", [a])
    released = core.released
    expect_error(client, "StatusCode.INTERNAL", "internal error", "badout", [a])
    assert core.released == released + 1  # released even when encoding failed
    bad = grpcclient.InferInput("INPUT0", [1, 8], "FP32")  # 16 floats, shape says 8
    bad.set_data_from_numpy(np.ones((1, 8), np.float32))
    bad.set_shape([1, 16])
    expect_error(client, "StatusCode.INVALID_ARGUMENT",
                 "input byte size mismatch for input 'INPUT0' for model 'identity'. "
                 "Expected 64, got 32", "identity", [bad])


def test_infer_protocol_errors(stub):
    msg = typed_request(INPUT0=("FP32", [2], "fp32_contents", [1, 2]))
    msg.raw_input_contents.append(b"\0" * 8)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(msg, timeout=T)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents field must not be specified" in e.value.details()
    msg = service_pb2.ModelInferRequest(model_name="identity")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    msg.raw_input_contents.extend([b"\0" * 8, b"\0" * 8])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(msg, timeout=T)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ("expected 1 raw_input_contents (one per input not in "
                                 "shared memory) for model 'identity', got 2")


# ------------------------------------------------------------------------ streaming


def test_stream_sync_client(client, core):
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        # The first request sleeps longest: if requests ran one at a time, the
        # answers would come back in request order.
        delays = [1.0, 0.5, 0.0]
        for n, delay in enumerate(delays):
            a = np.full((1, 16), n, np.float32)
            client.async_stream_infer("slow", [fp32_input(a)], request_id=f"s{n}",
                                      parameters={"delay": delay})
        client.async_stream_infer("nonexistent", [fp32_input(np.ones((1, 16), np.float32))],
                                  request_id="bad")
        client.async_stream_infer("badout", [fp32_input(np.ones((1, 16), np.float32))],
                                  request_id="badout")
        got = [results.get(timeout=T) for _ in range(5)]
    finally:
        client.stop_stream()
    errors = [e.message() for r, e in got if e is not None]
    assert len(errors) == 2
    assert any("internal error" in m for m in errors)
    assert any("unknown model: 'nonexistent'" in m for m in errors)
    ok = {r.get_response().id: r for r, e in got if e is None}
    assert set(ok) == {"s0", "s1", "s2"}
    for n in range(3):
        np.testing.assert_array_equal(ok[f"s{n}"].as_numpy("OUTPUT0"),
                                      np.full((1, 16), n, np.float32))
    order = [r.get_response().id for r, e in got if e is None]
    # several in flight, answered as they finished: the one that sleeps 0 s is not held
    # behind the one that sleeps 1 s (s0 and s1 may swap on a stalled machine)
    assert order[0] == "s2"


def test_stream_error_keeps_request_id(stub):
    msg = typed_request(INPUT0=("FP32", [4], "fp32_contents", [1, 2]))  # 8 of 16 bytes
    msg.id = "short"
    replies = list(stub.ModelStreamInfer(iter([msg]), timeout=T))
    assert len(replies) == 1
    assert "input byte size mismatch" in replies[0].error_message
    assert replies[0].infer_response.id == "short"


# ------------------------------------------------------------------------- aio client


def test_aio_client(server, core):
    async def scenario():
        c = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert await c.is_server_live(client_timeout=T)
            assert await c.is_server_ready(client_timeout=T)
            assert await c.is_model_ready("identity", client_timeout=T)
            assert not await c.is_model_ready("nonexistent", client_timeout=T)
            assert (await c.get_server_metadata(client_timeout=T)).name == "shmserve"
            assert (await c.get_model_metadata("identity", client_timeout=T)).name == "identity"
            cfg = await c.get_model_config("identity", client_timeout=T)
            assert cfg.config.max_batch_size == 8

            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            s = np.array([[b"aio"]], dtype=object)
            inputs = [fp32_input(a), bytes_input(s)]
            results = await asyncio.gather(*(
                c.infer("identity", inputs, request_id=str(n), client_timeout=T)
                for n in range(8)))
            assert sorted(r.get_response().id for r in results) == [str(n) for n in range(8)]
            np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), a)
            assert results[0].as_numpy("OUTPUT1").tolist() == [[b"aio"]]

            with pytest.raises(InferenceServerException) as e:
                await c.infer("nonexistent", inputs, client_timeout=T)
            assert status_of(e) == "StatusCode.NOT_FOUND"

            async def requests():
                for n in range(5):
                    yield {"model_name": "slow", "request_id": f"a{n}",
                           "inputs": [fp32_input(np.full((1, 16), n, np.float32))],
                           "parameters": {"delay": 0.05 * (5 - n)}}
                yield {"model_name": "down", "request_id": "x",
                       "inputs": [fp32_input(a)]}

            got = []
            async for result, error in c.stream_infer(requests(), stream_timeout=T):
                got.append((result, error))
                if len(got) == 6:
                    break
            errors = [e for r, e in got if e is not None]
            assert len(errors) == 1 and "not ready" in errors[0].message()
            ids = {r.get_response().id for r, e in got if e is None}
            assert ids == {f"a{n}" for n in range(5)}
        finally:
            await c.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert core.max_in_flight > 1


# --------------------------------------------------------------------------- binding


def test_the_servicer_is_tested_on_the_transport_production_runs(server):
    from frontend.transport.grpc_native import NativeGrpcServer
    from shm.messages.roles import FrontendSpec

    argv = ["--index", "0", "--address", "a", "--scheduler", "s", "--segment-prefix", "p"]
    assert FrontendSpec.from_argv(argv).grpc_frontend == "native"
    assert isinstance(server.server, NativeGrpcServer)


def test_options_share_the_port_and_allow_large_messages():
    opts = dict(server_options())
    assert opts["grpc.so_reuseport"] == 1
    assert opts["grpc.max_send_message_length"] >= 2**31 - 1
    assert opts["grpc.max_receive_message_length"] >= 2**31 - 1


def test_two_servers_share_one_port():
    with socket.socket() as s:  # a free port to share
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = ServerThread(FakeCore(), f"127.0.0.1:{port}")
    try:
        second = ServerThread(FakeCore(), f"127.0.0.1:{port}")  # binds: SO_REUSEPORT
        try:
            assert first.port == second.port == port
            with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as c:
                assert c.is_server_live(client_timeout=T)
        finally:
            second.stop()
    finally:
        first.stop()


def test_a_triton_grpc_error_stream_reset_by_its_client_stops_reading():
    """A stream opened with `triton_grpc_error: true` reads its requests on a task of
    its own; a client that resets the stream (the call is cancelled) while that task
    waits for its next request leaves nothing behind: the reader ends with the call
    and its request iterator is closed, as on a plain stream."""
    from frontend.grpc_server import InferenceServicer

    class Context:
        def invocation_metadata(self):
            return (("triton_grpc_error", "true"),)

        def peer(self):
            return "ipv4:127.0.0.1:1000"

    async def main():
        servicer = InferenceServicer(FakeDataPlane(), "shmserve", "0", ())
        waiting, closed = asyncio.Event(), asyncio.Event()

        async def requests():  # the client sends nothing, and never ends the stream
            try:
                waiting.set()
                await asyncio.Event().wait()
                yield b""
            finally:
                closed.set()

        call = asyncio.ensure_future(servicer.model_stream_infer(requests(), Context()))
        await asyncio.wait_for(waiting.wait(), T)
        call.cancel()  # RST_STREAM from the client
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(closed.wait(), T)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not left, left

    asyncio.run(main())


def test_a_triton_grpc_error_stream_reads_nothing_after_its_first_error():
    """A client that keeps sending on a `triton_grpc_error: true` stream after a
    request failed: the stream ends with that error as its status, the requests after
    it are neither read nor started (what it sends stays in the flow-control window),
    and no task or request is left behind."""
    from types import SimpleNamespace

    from frontend.grpc_server import InferenceServicer
    from shm.errors import ErrorCode, InferError

    class Aborted(Exception):
        pass

    class Context:
        status = None

        def invocation_metadata(self):
            return (("triton_grpc_error", "true"),)

        def peer(self):
            return "ipv4:127.0.0.1:1000"

        async def write(self, reply):
            raise AssertionError("nothing is written in-band in this mode")

        async def abort(self, code, message):
            self.status = (code, message)
            raise Aborted

    class Failing(FakeDataPlane):
        started = 0

        def start(self, request, decoupled_refusal=""):
            self.started += 1

            async def next():
                return InferError(ErrorCode.INVALID_ARG, "the model refused it"), True
            return SimpleNamespace(view=SimpleNamespace(name="m", version=1), next=next,
                                   cancel=lambda: None)

    message = service_pb2.ModelInferRequest(model_name="m").SerializeToString()

    async def main():
        core, context = Failing(), Context()
        servicer = InferenceServicer(core, "shmserve", "0", ())
        read = 0

        async def requests():  # sends for ever, as fast as it is read
            nonlocal read
            while True:
                read += 1
                yield message
                await asyncio.sleep(0)

        with pytest.raises(Aborted):
            await asyncio.wait_for(servicer.model_stream_infer(requests(), context), T)
        assert context.status == (grpc.StatusCode.INVALID_ARGUMENT, "the model refused it")
        # the reader runs a few loop turns ahead of the first request, no further
        assert core.started == read <= 5, (core.started, read)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not left, left

    asyncio.run(main())


def test_a_connections_streams_run_at_most_its_cap_of_requests_and_read_on_as_they_end():
    """A client that pipelines requests on two streams of one connection without end:
    no more than stream_in_flight_max run at once on the two, a stream is not read
    while they do (what the client sends waits in its flow-control window), each
    request that ends lets one more in, in the order the streams asked, and every one
    read is answered. Another connection's stream is not held back."""
    from types import SimpleNamespace

    from frontend.grpc_server import InferenceServicer

    class Held(FakeDataPlane):
        """Requests that end when the test says so."""

        def __init__(self):
            self.gates: list[asyncio.Future] = []

        def start(self, request, decoupled_refusal=""):
            gate = asyncio.get_running_loop().create_future()
            self.gates.append(gate)

            async def next():
                await gate
                return InferError(ErrorCode.INTERNAL, "done"), True
            return SimpleNamespace(view=SimpleNamespace(name="m", version=1), next=next,
                                   cancel=lambda: None)

    class Context:
        def __init__(self, peer):
            self.replies = 0
            self.address = peer

        def invocation_metadata(self):
            return ()

        def peer(self):
            return self.address

        async def write(self, reply):
            self.replies += 1

    message = service_pb2.ModelInferRequest(model_name="m").SerializeToString()

    async def main():
        core = Held()
        servicer = InferenceServicer(core, "shmserve", "0", (), stream_in_flight_max=4)
        read = {}

        async def requests(name):  # as many as the server reads (bounded, should it not)
            while read[name] < 1000:
                read[name] += 1
                yield message

        async def settled():
            for _ in range(20):
                await asyncio.sleep(0)

        def stream(name, peer="ipv4:127.0.0.1:1000"):
            read[name] = 0
            context = Context(peer)
            return context, asyncio.ensure_future(
                servicer.model_stream_infer(requests(name), context))

        a, call_a = stream("a")
        await settled()
        b, call_b = stream("b")
        await settled()
        # four running, all a's; both readers wait for a slot with no message taken
        # (an async generator runs up to its yield only when asked for its next item)
        assert (len(core.gates), read) == (4, {"a": 4, "b": 0})
        # each slot freed goes to the reader that asked first: a (asked before b
        # came), then b, then a again (it asked anew once it had started its fifth)
        for n, want in enumerate([{"a": 5, "b": 0}, {"a": 5, "b": 1}, {"a": 6, "b": 1}]):
            core.gates[n].set_result(None)
            await settled()
            assert len(core.gates) == 5 + n and read == want
            assert a.replies == n + 1
        assert sum(not g.done() for g in core.gates) == 4
        other, call_other = stream("other", peer="ipv4:127.0.0.1:2000")
        await settled()
        assert read["other"] == 4 and len(core.gates) == 11
        for call in (call_a, call_b, call_other):
            call.cancel()
        await asyncio.gather(call_a, call_b, call_other, return_exceptions=True)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not left, left
        assert not servicer.stream_slots.by_peer  # nothing kept past the connections

    asyncio.run(main())


def _wait_idle(core, seconds=T):
    """Poll until no infer runs in the fake core; whether it got there in time."""
    end = time.monotonic() + seconds
    while core.in_flight and time.monotonic() < end:
        time.sleep(0.01)
    return core.in_flight == 0


def test_infer_past_its_deadline_is_answered_and_dropped(client, core):
    """ModelInfer runs without a task on the native transport (its starter): a
    deadline that passes answers DEADLINE_EXCEEDED and drops the request in the core."""
    a = fp32_input(np.ones((1, 16), np.float32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        client.infer("slow", [a], parameters={"delay": 30}, client_timeout=0.3)
    assert status_of(e) == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 5
    assert _wait_idle(core)  # the fake's infer was cancelled, not left to sleep 30 s


def test_infer_its_client_cancels_is_dropped(stub, core):
    msg = typed_request(INPUT0=("FP32", [1, 16], "fp32_contents", [1.0] * 16))
    msg.model_name = "slow"
    msg.parameters["delay"].double_param = 30
    call = stub.ModelInfer.future(msg, timeout=T)
    end = time.monotonic() + T
    while not core.in_flight and time.monotonic() < end:
        time.sleep(0.01)
    assert core.in_flight == 1
    call.cancel()  # RST_STREAM: the transport cancels what the call waits on
    assert _wait_idle(core)
    assert call.cancelled()
