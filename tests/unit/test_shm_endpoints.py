"""frontend.shm_endpoints: the system and CUDA shared-memory extensions over HTTP and
gRPC, and inference with tensors in client regions, against a fake data plane.

tritonclient itself builds the requests and parses the answers wherever it can (over a
real socket); the ASGI interface is driven directly for what tritonclient never sends
(malformed bodies, wrong methods)."""

import base64
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from frontend.http_server import make_http_app
from frontend.shm_endpoints import parse_register_body
from frontend.types import InferResult, OutputTensor
from shm.errors import ErrorCode, InferError
from shm.messages.regions import CUDA, SYSTEM, RegionStatus
from tests.unit.fake_dataplane import FakeDataPlane
from tests.unit.test_grpc_server import ServerThread
from tests.unit.test_http_server import call, served  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(60)
T = 10
HANDLE = bytes(range(64))  # a cudaIpcMemHandle_t's worth of bytes


class FakeCore(FakeDataPlane):
    """A registry like the scheduler's, in a dict; every shm_call is recorded, and
    `fail_with` makes the next ones raise. `infer` answers each requested output: into
    its region when it names one (as the core reports it), else with `PLAIN` bytes."""

    PLAIN = np.arange(4, dtype=np.int32)

    def __init__(self):
        self.regions: dict[str, RegionStatus] = {}
        self.calls = []
        self.requests = []
        self.fail_with = None

    def server_live(self):
        return True

    def server_ready(self):
        return True

    async def shm_call(self, op, kind, *, name="", key="", offset=0, byte_size=0,
                       device_id=0, raw_handle=b""):
        self.calls.append((op, kind, name, dict(key=key, offset=offset, byte_size=byte_size,
                                                device_id=device_id, raw_handle=raw_handle)))
        if self.fail_with is not None:
            raise self.fail_with
        mine = {n: r for n, r in self.regions.items() if r.kind == kind}
        if op == "register":
            if name in self.regions:
                raise InferError(ErrorCode.ALREADY_EXISTS,
                                 f"shared memory region '{name}' already in manager")
            self.regions[name] = RegionStatus(name, kind, key, offset, byte_size, device_id)
            return []
        if op == "status":
            if not name:
                return list(mine.values())
            if name not in mine:
                raise InferError(ErrorCode.NOT_FOUND,
                                 f"Unable to find {kind} shared memory region: '{name}'")
            return [mine[name]]
        for n in ([name] if name else list(mine)):
            self.regions.pop(n, None)
        return []

    async def infer(self, request, decoupled_refusal=""):
        self.requests.append(request)
        outputs = []
        for out in request.outputs or ():
            p = out.parameters
            if "shared_memory_region" in p:
                outputs.append(OutputTensor(out.name, "FP32", [2, 2], None, {
                    "shared_memory_region": p["shared_memory_region"],
                    "shared_memory_byte_size": 16}))
            else:
                outputs.append(OutputTensor(out.name, "INT32", [4], self.PLAIN.tobytes()))
        return InferResult(request.model_name, "1", request.id, outputs)


@pytest.fixture
def core():
    return FakeCore()


@pytest.fixture
def app(core):
    return make_http_app(core)


@pytest.fixture
def http_client(served):
    client = httpclient.InferenceServerClient(served)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_server():
    srv = ServerThread(FakeCore())
    yield srv
    srv.stop()


@pytest.fixture
def grpc_client(grpc_server):
    grpc_server.core.__init__()  # a fresh registry for each test
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    yield c
    c.close()


def http_error(status_head_body):
    status, head, body = status_head_body
    assert head["content-type"] == "application/json"
    return status, json.loads(body)["error"]


# --------------------------------------------------------------------- HTTP, tritonclient


def test_http_system_register_status_unregister(http_client, core):
    http_client.register_system_shared_memory("in", "/shm_in", 64, offset=16)
    http_client.register_system_shared_memory("out", "/shm_out", 128)
    assert core.calls[0] == ("register", SYSTEM, "in", dict(
        key="/shm_in", offset=16, byte_size=64, device_id=0, raw_handle=b""))
    assert http_client.get_system_shared_memory_status() == [
        {"name": "in", "key": "/shm_in", "offset": 16, "byte_size": 64},
        {"name": "out", "key": "/shm_out", "offset": 0, "byte_size": 128}]
    assert http_client.get_system_shared_memory_status("out") == [
        {"name": "out", "key": "/shm_out", "offset": 0, "byte_size": 128}]
    http_client.unregister_system_shared_memory("in")
    assert [r["name"] for r in http_client.get_system_shared_memory_status()] == ["out"]
    http_client.unregister_system_shared_memory()
    assert http_client.get_system_shared_memory_status() == []
    assert [c[:3] for c in core.calls if c[0] == "unregister"] == [
        ("unregister", SYSTEM, "in"), ("unregister", SYSTEM, "")]


def test_http_cuda_register_status_unregister(http_client, core):
    http_client.register_cuda_shared_memory("gpu", base64.b64encode(HANDLE), 1, 256)
    assert core.calls[0] == ("register", CUDA, "gpu", dict(
        key="", offset=0, byte_size=256, device_id=1, raw_handle=HANDLE))
    assert http_client.get_cuda_shared_memory_status() == [
        {"name": "gpu", "device_id": 1, "byte_size": 256}]
    assert http_client.get_cuda_shared_memory_status("gpu") == [
        {"name": "gpu", "device_id": 1, "byte_size": 256}]
    assert http_client.get_system_shared_memory_status() == []  # kinds are apart
    http_client.unregister_cuda_shared_memory("gpu")
    http_client.unregister_cuda_shared_memory()
    assert http_client.get_cuda_shared_memory_status() == []


@pytest.mark.parametrize("error,status", [
    (InferError(ErrorCode.NOT_FOUND, "Unable to find system shared memory region: 'x'"),
     "404"),
    (InferError(ErrorCode.INVALID_ARG, "failed to open shared memory region"), "400"),
    (InferError(ErrorCode.UNSUPPORTED, "client shared memory is not allowed"), "501"),
    # Triton 2.51 answers a second registration of a name with 400
    (InferError(ErrorCode.ALREADY_EXISTS, "already in manager"), "400"),
])
def test_http_core_errors_reach_tritonclient(http_client, core, error, status):
    core.fail_with = error
    for fn, args in ((http_client.register_system_shared_memory, ("x", "/k", 8)),
                     (http_client.get_system_shared_memory_status, ("x",)),
                     (http_client.unregister_cuda_shared_memory, ()),
                     (http_client.register_cuda_shared_memory,
                      ("x", base64.b64encode(HANDLE), 0, 8))):
        with pytest.raises(InferenceServerException) as info:
            fn(*args)
        assert (info.value.status(), info.value.message()) == (status, error.message)


def test_http_infer_with_shared_memory(http_client, core):
    inp = httpclient.InferInput("INPUT0", [2, 2], "FP32")
    inp.set_shared_memory("in", 16, offset=32)
    in_shm = httpclient.InferRequestedOutput("OUT_SHM")
    in_shm.set_shared_memory("out", 16)
    plain = httpclient.InferRequestedOutput("OUT_PLAIN", binary_data=True)
    result = http_client.infer("m", [inp], outputs=[in_shm, plain], request_id="r1")

    request = core.requests[-1]
    assert request.inputs[0].data is None
    assert request.inputs[0].parameters == {"shared_memory_region": "in",
                                            "shared_memory_byte_size": 16,
                                            "shared_memory_offset": 32}
    assert request.outputs[0].parameters["shared_memory_region"] == "out"
    assert request.outputs[0].parameters["shared_memory_byte_size"] == 16
    # Triton's answer for an output in a region: name, datatype and shape, nothing more
    assert result.get_output("OUT_SHM") == {"name": "OUT_SHM", "datatype": "FP32",
                                            "shape": [2, 2]}
    np.testing.assert_array_equal(result.as_numpy("OUT_PLAIN"), FakeCore.PLAIN)
    assert result.get_response()["id"] == "r1"


# ------------------------------------------------------------- HTTP, what clients mangle


@pytest.mark.parametrize("path", [
    "/v2/systemsharedmemory/status", "/v2/systemsharedmemory/region/r/status",
    "/v2/cudasharedmemory/status", "/v2/cudasharedmemory/region/r/status"])
def test_http_status_needs_get(app, path):
    assert http_error(call(app, "POST", path)) == (405, "Method Not Allowed")
    assert call(app, "GET", path)[0] in (200, 404)


@pytest.mark.parametrize("path", [
    "/v2/systemsharedmemory/region/r/register", "/v2/systemsharedmemory/unregister",
    "/v2/cudasharedmemory/region/r/unregister", "/v2/cudasharedmemory/register"])
def test_http_register_and_unregister_need_post(app, core, path):
    assert http_error(call(app, "GET", path)) == (405, "Method Not Allowed")
    assert core.calls == []


@pytest.mark.parametrize("kind,path", [(SYSTEM, "/v2/systemsharedmemory/register"),
                                       (CUDA, "/v2/cudasharedmemory/register")])
def test_http_register_needs_a_region_name(app, core, kind, path):
    body = json.dumps({"key": "/k", "byte_size": 8}).encode()
    assert http_error(call(app, "POST", path, body)) == (
        400, f"'region name' is necessary to register {kind} shared memory region")
    assert core.calls == []


@pytest.mark.parametrize("body,message", [
    (b"", "failed to parse the request JSON buffer"),
    (b"{\"key\": ", "failed to parse the request JSON buffer"),
    (b"[1]", "failed to parse the request JSON buffer: expected a JSON object"),
    ({"byte_size": 8}, "Shared memory register request has no 'key' field"),
    ({"key": 5, "byte_size": 8}, "Unable to parse 'key': expected a string"),
    ({"key": "/k"}, "Shared memory register request has no 'byte_size' field"),
    ({"key": "/k", "byte_size": -8},
     "Unable to parse 'byte_size': expected a non-negative integer"),
    ({"key": "/k", "byte_size": "8"},
     "Unable to parse 'byte_size': expected a non-negative integer"),
    ({"key": "/k", "byte_size": 1 << 64},
     "Unable to parse 'byte_size': expected a non-negative integer"),
    ({"key": "/k", "byte_size": 8, "offset": -1},
     "Unable to parse 'offset': expected a non-negative integer"),
    ({"key": "/k", "byte_size": 8, "offset": True},
     "Unable to parse 'offset': expected a non-negative integer"),
])
def test_http_malformed_system_register(app, core, body, message):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    status, text = http_error(call(app, "POST", "/v2/systemsharedmemory/region/r/register",
                                   body))
    assert status == 400 and text.startswith(message)
    assert core.calls == []


B64 = base64.b64encode(HANDLE).decode()


@pytest.mark.parametrize("body,message", [
    ({"device_id": 0, "byte_size": 8},
     "Shared memory register request has no 'raw_handle' field"),
    ({"raw_handle": B64, "device_id": 0, "byte_size": 8},
     "Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}"),
    ({"raw_handle": {"b64": 7}, "device_id": 0, "byte_size": 8},
     "Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}"),
    ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 8},
     "Unable to parse 'raw_handle': invalid base64 encoding"),
    ({"raw_handle": {"b64": base64.b64encode(b"short").decode()}, "device_id": 0,
      "byte_size": 8}, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ({"raw_handle": {"b64": B64}, "byte_size": 8},
     "Shared memory register request has no 'device_id' field"),
    ({"raw_handle": {"b64": B64}, "device_id": -1, "byte_size": 8},
     "Unable to parse 'device_id': expected a non-negative integer"),
    ({"raw_handle": {"b64": B64}, "device_id": 0},
     "Shared memory register request has no 'byte_size' field"),
])
def test_http_malformed_cuda_register(app, core, body, message):
    status, text = http_error(call(app, "POST", "/v2/cudasharedmemory/region/g/register",
                                   json.dumps(body).encode()))
    assert (status, text) == (400, message)
    assert core.calls == []


def test_register_body_defaults_and_extra_fields():
    assert parse_register_body(SYSTEM, b'{"key": "/k", "byte_size": 8, "x": 1}') == {
        "key": "/k", "offset": 0, "byte_size": 8}
    assert parse_register_body(CUDA, json.dumps(
        {"raw_handle": {"b64": B64}, "device_id": 2, "byte_size": 8}).encode()) == {
        "raw_handle": HANDLE, "device_id": 2, "byte_size": 8}


def test_http_unexpected_core_failure_is_500(app, core):
    core.fail_with = RuntimeError("the registry fell over")
    assert http_error(call(app, "GET", "/v2/systemsharedmemory/status")) == (
        500, "internal error: the registry fell over")


def test_http_success_bodies(app, core):
    status, head, body = call(app, "POST", "/v2/systemsharedmemory/region/r/register",
                              json.dumps({"key": "/k", "byte_size": 8}).encode())
    assert (status, head["content-type"], body) == (200, "application/json", b"")
    status, head, body = call(app, "GET", "/v2/systemsharedmemory/region/r/status")
    assert (status, json.loads(body)) == (200, [{"name": "r", "key": "/k", "offset": 0,
                                                 "byte_size": 8}])
    assert http_error(call(app, "GET", "/v2/cudasharedmemory/region/r/status")) == (
        404, "Unable to find cuda shared memory region: 'r'")
    assert call(app, "POST", "/v2/systemsharedmemory/region/r/unregister")[::2] == (200, b"")


# -------------------------------------------------------------------------------- gRPC


def test_grpc_system_register_status_unregister(grpc_client, grpc_server):
    core = grpc_server.core
    grpc_client.register_system_shared_memory("in", "/shm_in", 64, offset=16,
                                              client_timeout=T)
    grpc_client.register_system_shared_memory("out", "/shm_out", 128, client_timeout=T)
    assert core.calls[0] == ("register", SYSTEM, "in", dict(
        key="/shm_in", offset=16, byte_size=64, device_id=0, raw_handle=b""))
    status = grpc_client.get_system_shared_memory_status(client_timeout=T)
    assert {n: (r.name, r.key, r.offset, r.byte_size) for n, r in status.regions.items()} == {
        "in": ("in", "/shm_in", 16, 64), "out": ("out", "/shm_out", 0, 128)}
    status = grpc_client.get_system_shared_memory_status("out", as_json=True,
                                                         client_timeout=T)
    assert status == {"regions": {"out": {"name": "out", "key": "/shm_out",
                                          "byte_size": "128"}}}  # MessageToJson's uint64
    grpc_client.unregister_system_shared_memory("in", client_timeout=T)
    assert list(grpc_client.get_system_shared_memory_status(
        client_timeout=T).regions) == ["out"]
    grpc_client.unregister_system_shared_memory(client_timeout=T)
    assert not grpc_client.get_system_shared_memory_status(client_timeout=T).regions
    assert [c[:3] for c in core.calls if c[0] == "unregister"] == [
        ("unregister", SYSTEM, "in"), ("unregister", SYSTEM, "")]


def test_grpc_cuda_register_status_unregister(grpc_client, grpc_server):
    core = grpc_server.core
    grpc_client.register_cuda_shared_memory("gpu", base64.b64encode(HANDLE), 1, 256,
                                            client_timeout=T)
    assert core.calls[0] == ("register", CUDA, "gpu", dict(
        key="", offset=0, byte_size=256, device_id=1, raw_handle=HANDLE))
    status = grpc_client.get_cuda_shared_memory_status(client_timeout=T)
    r = status.regions["gpu"]
    assert (r.name, r.device_id, r.byte_size) == ("gpu", 1, 256)
    assert list(grpc_client.get_cuda_shared_memory_status(
        "gpu", client_timeout=T).regions) == ["gpu"]
    assert not grpc_client.get_system_shared_memory_status(client_timeout=T).regions
    grpc_client.unregister_cuda_shared_memory("gpu", client_timeout=T)
    grpc_client.unregister_cuda_shared_memory(client_timeout=T)
    assert not grpc_client.get_cuda_shared_memory_status(client_timeout=T).regions


@pytest.mark.parametrize("code,status", [
    (ErrorCode.NOT_FOUND, "StatusCode.NOT_FOUND"),
    (ErrorCode.INVALID_ARG, "StatusCode.INVALID_ARGUMENT"),
    (ErrorCode.UNSUPPORTED, "StatusCode.UNIMPLEMENTED"),
    (ErrorCode.ALREADY_EXISTS, "StatusCode.ALREADY_EXISTS"),
])
def test_grpc_core_errors_reach_tritonclient(grpc_client, grpc_server, code, status):
    grpc_server.core.fail_with = InferError(code, "the registry says no")
    for fn, args in ((grpc_client.register_system_shared_memory, ("x", "/k", 8)),
                     (grpc_client.get_system_shared_memory_status, ("x",)),
                     (grpc_client.unregister_system_shared_memory, ()),
                     (grpc_client.register_cuda_shared_memory,
                      ("x", base64.b64encode(HANDLE), 0, 8)),
                     (grpc_client.get_cuda_shared_memory_status, ()),
                     (grpc_client.unregister_cuda_shared_memory, ("x",))):
        with pytest.raises(InferenceServerException) as info:
            fn(*args, client_timeout=T)
        assert (info.value.status(), info.value.message()) == (
            status, "the registry says no")


def test_grpc_register_checks(grpc_client, grpc_server):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.register_system_shared_memory("", "/k", 8, client_timeout=T)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "'region name' is necessary to register system shared memory region")
    with pytest.raises(InferenceServerException) as info:
        grpc_client.register_cuda_shared_memory("g", base64.b64encode(b"short"), 0, 8,
                                                client_timeout=T)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    assert grpc_server.core.calls == []


def test_grpc_unexpected_core_failure_is_internal(grpc_client, grpc_server):
    grpc_server.core.fail_with = RuntimeError("the registry fell over")
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_cuda_shared_memory_status(client_timeout=T)
    assert info.value.status() == "StatusCode.INTERNAL"
    assert info.value.message() == "internal error: the registry fell over"


def test_grpc_server_metadata_lists_the_extensions(grpc_client):
    extensions = grpc_client.get_server_metadata(client_timeout=T).extensions
    assert "system_shared_memory" in extensions and "cuda_shared_memory" in extensions


@pytest.mark.parametrize("shm_first", [True, False])
def test_grpc_infer_with_shared_memory(grpc_client, grpc_server, shm_first):
    core = grpc_server.core
    inp = grpcclient.InferInput("INPUT0", [2, 2], "FP32")
    inp.set_shared_memory("in", 16, offset=32)
    in_shm = grpcclient.InferRequestedOutput("OUT_SHM")
    in_shm.set_shared_memory("out", 16)
    plain = grpcclient.InferRequestedOutput("OUT_PLAIN")
    outputs = [in_shm, plain] if shm_first else [plain, in_shm]
    result = grpc_client.infer("m", [inp], outputs=outputs, client_timeout=T)

    request = core.requests[-1]
    assert request.inputs[0].data is None
    assert request.inputs[0].parameters == {"shared_memory_region": "in",
                                            "shared_memory_byte_size": 16,
                                            "shared_memory_offset": 32}
    assert [(o.name, o.parameters) for o in request.outputs][shm_first is False] == (
        "OUT_SHM", {"shared_memory_region": "out", "shared_memory_byte_size": 16})
    # the plain output is found in its own raw_output_contents slot either way
    np.testing.assert_array_equal(result.as_numpy("OUT_PLAIN"), FakeCore.PLAIN)
    response = result.get_response()
    assert len(response.raw_output_contents) == 2
    out = result.get_output("OUT_SHM")
    assert (out.datatype, list(out.shape), dict(out.parameters)) == ("FP32", [2, 2], {})
    index = [o.name for o in response.outputs].index("OUT_SHM")
    assert response.raw_output_contents[index] == b""


def test_grpc_infer_shared_memory_misuse_is_invalid_argument(grpc_client):
    inp = grpcclient.InferInput("INPUT0", [2, 2], "FP32")
    inp.set_shared_memory("in", 16)
    inp._get_tensor().parameters["shared_memory_byte_size"].string_param = "16"
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("m", [inp], client_timeout=T)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "invalid value type for 'shared_memory_byte_size' parameter for tensor "
        "'INPUT0', expected int64_param.")


def test_grpc_status_codes_are_grpcs(grpc_server):
    # a raw stub, to see the status itself rather than tritonclient's rendering of it
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    grpc_server.core.__init__()
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.SystemSharedMemoryStatus(
                service_pb2.SystemSharedMemoryStatusRequest(name="nope"), timeout=T)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == (
            "Unable to find system shared memory region: 'nope'")
        reply = stub.SystemSharedMemoryRegister(service_pb2.SystemSharedMemoryRegisterRequest(
            name="r", key="/k", offset=4, byte_size=8), timeout=T)
        assert reply == service_pb2.SystemSharedMemoryRegisterResponse()
