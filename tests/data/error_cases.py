"""Triton's error paths as a table: each case is one request (or a short sequence of
calls) written once against a protocol-neutral `Ctx`, and run over HTTP and over gRPC
with the official `tritonclient` (raw HTTP where the client would hide or refuse what
the server says). `run_case` turns what the server answered into an outcome:

    {"status": 400, "message": "..."}            HTTP
    {"code": "INVALID_ARGUMENT", "message": "..."}  gRPC
    {"status": "ok"} / {"code": "OK"}            no error

plus "after" where a case observes more than one answer (a held request's result).
`scripts/error_table.py` runs the table against any server and writes the outcomes as
JSON; `tests/data/triton_errors_2.51.json` holds the real Triton's, and
`tests/e2e/test_error_table.py` holds shmserve to them. The models are
`tests/models_errors`, served with `--exit-on-error=false --strict-readiness=false`
(so `err_broken`, which never loads, is there and not ready).
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils as tu
import tritonclient.utils.shared_memory as shm

REPOSITORY = Path(__file__).resolve().parents[1] / "models_errors"
# the flags both servers are started with for the table
SERVER_FLAGS = ("--exit-on-error=false", "--strict-readiness=false")
PROTOCOLS = ("http", "grpc")
F32 = 16  # bytes in a [4] FP32 tensor


class Ctx:
    """One protocol's view of a server: the client, and system shm regions that the
    case creates (each key names the case, so both servers see the same names)."""

    def __init__(self, protocol: str, http_url: str, grpc_url: str, case_id: str):
        self.protocol, self.http_url, self.grpc_url = protocol, http_url, grpc_url
        self.case_id = case_id
        self.mod = httpclient if protocol == "http" else grpcclient
        self.client = self.new_client()
        self._regions: list = []
        self._registered: list[str] = []

    def new_client(self):
        if self.protocol == "http":
            return httpclient.InferenceServerClient(self.http_url, network_timeout=60)
        return grpcclient.InferenceServerClient(self.grpc_url)

    # --- tensors ---------------------------------------------------------------------
    def tensor(self, name, array, datatype=None, shape=None):
        array = np.asarray(array)
        datatype = datatype or tu.np_to_triton_dtype(array.dtype)
        inp = self.mod.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        if shape is not None:  # lie about the shape after the data is set
            inp.set_shape(list(shape))
        return inp

    def shm_tensor(self, name, shape, datatype, region, byte_size, offset=0):
        inp = self.mod.InferInput(name, list(shape), datatype)
        inp.set_shared_memory(region, byte_size, offset)
        return inp

    def output(self, name, class_count=0, region=None, byte_size=0, offset=0):
        if self.protocol == "http":
            out = httpclient.InferRequestedOutput(name, binary_data=True,
                                                  class_count=class_count)
        else:
            out = grpcclient.InferRequestedOutput(name, class_count=class_count)
        if region is not None:
            out.set_shared_memory(region, byte_size, offset)
        return out

    def infer(self, model, inputs, outputs=None, version="", **kw):
        return self.client.infer(model, inputs, outputs=outputs, model_version=version,
                                 **kw)

    # --- system shared memory -------------------------------------------------------
    def key(self, suffix=""):
        return f"/errtab_{self.case_id}{suffix}"

    def region(self, name, size, key=None, register=True, fill=None):
        """Create a system shm object (and register it as `name`)."""
        key = key or self.key("_" + name)
        handle = shm.create_shared_memory_region(name, key, size)
        self._regions.append(handle)
        if fill is not None:
            shm.set_shared_memory_region(handle, [np.asarray(fill)])
        if register:
            self.register(name, key, size)
        return key

    def register(self, name, key, size, offset=0):
        self._registered.append(name)
        self.client.register_system_shared_memory(name, key, size, offset=offset)

    def cleanup(self):
        for name in self._registered:
            try:
                self.client.unregister_system_shared_memory(name)
            except Exception:  # noqa: BLE001 - best effort: the case may have done it
                pass
        for handle in self._regions:
            try:
                shm.destroy_shared_memory_region(handle)
            except Exception:  # noqa: BLE001
                pass
        self.client.close()

    # --- raw HTTP ---------------------------------------------------------------------
    def raw(self, method, path, body=b"", headers=None):
        """Raises an InferenceServerException-alike for a non-200 answer, as the client
        would, but keeps the server's own status and error text."""
        host, port = self.http_url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            try:
                msg = json.loads(data)["error"]
            except Exception:  # noqa: BLE001 - not Triton's JSON error form: keep text
                msg = "<not json> " + data.decode(errors="replace")[:200]
            raise tu.InferenceServerException(msg=msg, status=str(resp.status))
        return data


@dataclass
class Case:
    """One error path: `fn(ctx)` makes the calls; `protocols` where it applies."""
    id: str
    rule: str
    fn: Callable[[Ctx], object]
    protocols: tuple = PROTOCOLS


CASES: list[Case] = []


def case(rule, protocols=PROTOCOLS):
    def deco(fn):
        CASES.append(Case(fn.__name__, rule, fn, protocols))
        return fn
    return deco


def _x(n=4, batch=1):
    return np.arange(batch * n, dtype=np.float32).reshape(batch, n)


def _pair(c, batch=1):
    return [c.tensor("INPUT0", _x(batch=batch)), c.tensor("INPUT1", _x(batch=batch))]


# --- models and versions --------------------------------------------------------------
@case("infer on a model the repository does not have")
def unknown_model(c):
    c.infer("no_such_model", _pair(c))


@case("infer on a version the model does not have")
def unknown_version(c):
    c.infer("err_id", _pair(c), version="3")


@case("infer on a version that is not a number", protocols=("grpc",))
def version_not_a_number(c):
    c.infer("err_id", _pair(c), version="one")


@case("infer on a model that failed to load (not ready)")
def model_not_ready(c):
    c.infer("err_broken", [c.tensor("INPUT0", _x()[0])])


@case("infer on a named version that failed to load")
def model_not_ready_version(c):
    c.infer("err_broken", [c.tensor("INPUT0", _x()[0])], version="1")


@case("metadata of an unknown model")
def metadata_unknown_model(c):
    c.client.get_model_metadata("no_such_model")


@case("metadata of a model that failed to load")
def metadata_not_ready(c):
    c.client.get_model_metadata("err_broken")


@case("config of an unknown model")
def config_unknown_model(c):
    c.client.get_model_config("no_such_model")


@case("config of an unknown version")
def config_unknown_version(c):
    c.client.get_model_config("err_id", "3")


@case("statistics of an unknown model")
def stats_unknown_model(c):
    c.client.get_inference_statistics("no_such_model")


@case("unary infer on a decoupled model")
def decoupled_unary(c):
    c.infer("err_decoupled", [c.tensor("INPUT0", _x()[0])])


# --- inputs ---------------------------------------------------------------------------
@case("an input name the model does not have")
def wrong_input_name(c):
    c.infer("err_id", [c.tensor("INPUTX", _x()), c.tensor("INPUT1", _x())])


@case("an input of the wrong shape")
def wrong_shape(c):
    c.infer("err_id", [c.tensor("INPUT0", np.zeros((1, 5), np.float32)),
                       c.tensor("INPUT1", _x())])


@case("an input of the wrong shape, model without batching")
def wrong_shape_nobatch(c):
    c.infer("err_nobatch", [c.tensor("INPUT0", np.zeros((1, 4), np.float32))])


@case("an input of the wrong rank (no batch dimension)")
def missing_batch_dim(c):
    c.infer("err_id", [c.tensor("INPUT0", _x()[0]), c.tensor("INPUT1", _x()[0])])


@case("an input of the wrong datatype")
def wrong_datatype(c):
    c.infer("err_id", [c.tensor("INPUT0", np.zeros((1, 4), np.int32)),
                       c.tensor("INPUT1", _x())])


@case("a model input missing")
def missing_input(c):
    c.infer("err_id", [c.tensor("INPUT0", _x())])


@case("no inputs at all")
def no_inputs(c):
    c.infer("err_id", [])


@case("an input the model does not have, besides all it has")
def extra_input(c):
    c.infer("err_id", _pair(c) + [c.tensor("EXTRA", _x())])


@case("the same input twice", protocols=("grpc",))
def duplicate_input(c):
    c.infer("err_id", _pair(c) + [c.tensor("INPUT0", _x())])


@case("inputs whose batch sizes differ")
def batch_sizes_differ(c):
    c.infer("err_id", [c.tensor("INPUT0", _x(batch=2)), c.tensor("INPUT1", _x(batch=3))])


@case("batch size over max_batch_size")
def batch_over_max(c):
    c.infer("err_id", _pair(c, batch=9))


@case("a batch of zero")
def batch_zero(c):
    z = np.zeros((0, 4), np.float32)
    c.infer("err_id", [c.tensor("INPUT0", z), c.tensor("INPUT1", z)])


@case("a batch of zero carrying one batch's bytes")
def batch_zero_with_data(c):
    c.infer("err_id", [c.tensor("INPUT0", _x(), shape=[0, 4]),
                       c.tensor("INPUT1", _x(), shape=[0, 4])])


@case("a batch of zero carrying two items' bytes")
def batch_zero_with_more_data(c):
    c.infer("err_id", [c.tensor("INPUT0", _x(batch=2), shape=[0, 4]),
                       c.tensor("INPUT1", _x(batch=2), shape=[0, 4])])


@case("the shape promises more bytes than were sent")
def byte_size_mismatch(c):
    c.infer("err_id", [c.tensor("INPUT0", _x(), shape=[1, 5]), c.tensor("INPUT1", _x())])


@case("the shape promises fewer bytes than were sent")
def byte_size_over(c):
    c.infer("err_nobatch", [c.tensor("INPUT0", _x(n=5)[0], shape=[4])])


@case("a negative dimension in an input's shape")
def negative_dim(c):
    c.infer("err_id", [c.tensor("INPUT0", _x(), shape=[1, -4]), c.tensor("INPUT1", _x())])


# --- outputs and protocol features ----------------------------------------------------
@case("a requested output the model does not have")
def unknown_output(c):
    c.infer("err_id", _pair(c), outputs=[c.output("NOPE")])


@case("classification of a BYTES output")
def classification_bytes(c):
    x = np.array([[b"a", b"b"]], dtype=np.object_)
    c.infer("err_bytes", [c.tensor("INPUT0", x, "BYTES")],
            outputs=[c.output("OUTPUT0", class_count=1)])


@case("a sequence id on a model without a sequence batcher")
def sequence_id_on_plain_model(c):
    c.infer("err_id", _pair(c), sequence_id=7, sequence_start=True)


@case("a priority on a model without priority levels")
def priority_without_levels(c):
    c.infer("err_id", _pair(c), priority=3)


# --- system shared memory: the regions ---------------------------------------------------
@case("register a region name twice")
def shm_register_twice(c):
    key = c.region("r", 64)
    c.register("r", key, 64)


@case("register a key that names no shared-memory object")
def shm_register_missing_key(c):
    c.register("r", c.key("_absent"), 64)


@case("register an offset past the object's end")
def shm_register_offset_out_of_range(c):
    key = c.region("base", 64, register=False)
    c.register("r", key, 16, offset=128)


@case("register a byte size past the object's end")
def shm_register_size_out_of_range(c):
    key = c.region("base", 64, register=False)
    c.register("r", key, 128)


@case("register an offset past the object's end with byte size 0")
def shm_register_offset_out_of_range_empty(c):
    key = c.region("base", 64, register=False)
    c.register("r", key, 0, offset=128)


@case("status of a region that is not registered")
def shm_status_unknown(c):
    c.client.get_system_shared_memory_status("nope")


@case("unregister a region that is not registered")
def shm_unregister_unknown(c):
    c.client.unregister_system_shared_memory("nope")


@case("infer naming a region that is not registered")
def shm_infer_unknown_region(c):
    c.region("in1", F32, fill=_x())
    c.infer("err_id", [c.shm_tensor("INPUT0", [1, 4], "FP32", "nope", F32),
                       c.shm_tensor("INPUT1", [1, 4], "FP32", "in1", F32)])


@case("infer naming a region that was unregistered")
def shm_infer_unregistered_region(c):
    c.region("in0", F32, fill=_x())
    c.region("in1", F32, fill=_x())
    c.client.unregister_system_shared_memory("in0")
    c.infer("err_id", [c.shm_tensor("INPUT0", [1, 4], "FP32", "in0", F32),
                       c.shm_tensor("INPUT1", [1, 4], "FP32", "in1", F32)])


@case("an input's offset + size past the region's end")
def shm_infer_input_offset_out_of_range(c):
    c.region("in", 2 * F32, fill=np.zeros(8, np.float32))
    c.infer("err_id", [c.shm_tensor("INPUT0", [1, 4], "FP32", "in", F32, offset=F32 + 4),
                       c.shm_tensor("INPUT1", [1, 4], "FP32", "in", F32)])


@case("an input's size larger than its shape needs")
def shm_infer_input_size_mismatch(c):
    c.region("in", 2 * F32, fill=np.zeros(8, np.float32))
    c.infer("err_id", [c.shm_tensor("INPUT0", [1, 4], "FP32", "in", 2 * F32),
                       c.shm_tensor("INPUT1", [1, 4], "FP32", "in", F32)])


@case("an output's region too small for the result")
def shm_output_region_too_small(c):
    c.region("out", 8)
    c.infer("err_id", _pair(c), outputs=[c.output("OUTPUT0", region="out", byte_size=8)])


@case("an output's offset + size past the region's end")
def shm_output_offset_out_of_range(c):
    c.region("out", F32)
    c.infer("err_id", _pair(c),
            outputs=[c.output("OUTPUT0", region="out", byte_size=F32, offset=8)])


@case("an output's offset at the region's end (Triton's qa: 'Invalid offset')")
def shm_output_offset_past_end(c):
    c.region("out", F32)
    c.infer("err_id", _pair(c),
            outputs=[c.output("OUTPUT0", region="out", byte_size=F32, offset=F32)])


@case("an input's offset past the region's end")
def shm_infer_input_offset_past_end(c):
    c.region("in", F32, fill=np.zeros(4, np.float32))
    c.infer("err_id", [c.shm_tensor("INPUT0", [1, 4], "FP32", "in", F32, offset=F32 + 4),
                       c.shm_tensor("INPUT1", [1, 4], "FP32", "in", F32)])


@case("unregister a region while a request is using it; then the request's answer")
def shm_unregister_in_use(c, name="in"):
    """The held request is let go once the unregister call has answered or the region
    is no longer listed (a server that waits for the request takes the name at once),
    whichever comes first: no server is left waiting on the other."""
    c.region("in", F32, fill=_x()[0])
    marker = os.path.join(tempfile.mkdtemp(prefix="errtab-"), "held")
    holder, unregisterer = c.new_client(), c.new_client()
    inp = c.shm_tensor("INPUT0", [4], "FP32", "in", F32)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(holder.infer, "err_slow", [inp], parameters={"marker": marker})
        try:
            _wait(lambda: os.path.exists(marker + ".started") or held.done(),
                  "the held request to start")
            if held.done():
                held.result()
                raise RuntimeError("the held request answered before it was held")
            call = pool.submit(unregisterer.unregister_system_shared_memory, name)
            _wait(lambda: call.done() or not _listed(c, "in"),
                  "the unregister call to answer or take the name")
        finally:
            open(marker + ".release", "w").close()
        unregister = _outcome_of_call(c.protocol, call)
        request = _outcome_of_call(c.protocol, held)
    holder.close()
    unregisterer.close()
    return {"unregister": unregister, "request": request}


def _wait(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout  # a bound, not a pace
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _listed(c, name) -> bool:
    status = c.client.get_system_shared_memory_status()
    if c.protocol == "http":
        return any(r["name"] == name for r in status)
    return name in status.regions


def _outcome_of_call(protocol, future):
    try:
        future.result(timeout=60)
        return outcome_ok(protocol)
    except tu.InferenceServerException as e:
        return outcome_of(protocol, e)


@case("unregister every region while a request is using one")
def shm_unregister_all_in_use(c):
    return shm_unregister_in_use(c, name="")


# --- CUDA shared memory ----------------------------------------------------------------
@case("register a CUDA region on a machine without a GPU (a made-up handle)")
def cuda_register_without_gpu(c):
    handle = base64.b64encode(bytes(64)).decode()
    c.client.register_cuda_shared_memory("cu", handle, 0, 64)


@case("status of a CUDA region that is not registered")
def cuda_status_unknown(c):
    c.client.get_cuda_shared_memory_status("nope")


# --- raw HTTP: what the clients would not send -----------------------------------------
INFER = "/v2/models/err_nobatch/infer"


def _json_input(**extra):
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                        "data": [1, 2, 3, 4], **extra}]}


@case("a body that is not JSON", protocols=("http",))
def http_malformed_json(c):
    c.raw("POST", INFER, b'{"inputs": [')


@case("a JSON request without 'inputs'", protocols=("http",))
def http_no_inputs_field(c):
    c.raw("POST", INFER, {"outputs": []})


@case("a datatype that does not exist", protocols=("http",))
def http_unknown_datatype(c):
    body = _json_input()
    body["inputs"][0]["datatype"] = "FP99"
    c.raw("POST", INFER, body)


@case("JSON data with fewer values than the shape", protocols=("http",))
def http_json_data_count(c):
    body = _json_input()
    body["inputs"][0]["data"] = [1, 2, 3]
    c.raw("POST", INFER, body)


@case("an input with neither data nor binary_data_size nor a region", protocols=("http",))
def http_input_without_data(c):
    body = _json_input()
    del body["inputs"][0]["data"]
    c.raw("POST", INFER, body)


@case("binary_data_size in a JSON-only request (no Inference-Header-Content-Length)",
      protocols=("http",))
def http_binary_size_without_header(c):
    body = _json_input()
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"binary_data_size": 16}
    c.raw("POST", INFER, body)


@case("Inference-Header-Content-Length longer than the body", protocols=("http",))
def http_header_length_past_body(c):
    body = _json_input()
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"binary_data_size": 16}
    header = json.dumps(body).encode()
    c.raw("POST", INFER, header + bytes(16),
          {"Inference-Header-Content-Length": str(len(header) + 100)})


@case("binary data left over after every input", protocols=("http",))
def http_binary_bytes_left_over(c):
    body = _json_input()
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"binary_data_size": 16}
    header = json.dumps(body).encode()
    c.raw("POST", INFER, header + bytes(20),
          {"Inference-Header-Content-Length": str(len(header))})


@case("a JSON value of the wrong type in 'data'", protocols=("http",))
def http_json_data_wrong_type(c):
    body = _json_input()
    body["inputs"][0]["data"] = ["a", "b", "c", "d"]
    c.raw("POST", INFER, body)


@case("a shape that is not a list of integers", protocols=("http",))
def http_shape_not_ints(c):
    body = _json_input()
    body["inputs"][0]["shape"] = ["four"]
    c.raw("POST", INFER, body)


@case("a BYTES output requested as JSON that is not UTF-8", protocols=("http",))
def http_bytes_output_not_utf8(c):
    # raw: the client would fail on the answer's JSON before showing what came back
    x = np.array([[b"\xff\xfe", b"ok"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_data_from_numpy(x, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    body, json_size = httpclient.InferenceServerClient.generate_request_body([inp], [out])
    data = c.raw("POST", "/v2/models/err_bytes/infer", body,
                 {"Inference-Header-Content-Length": str(json_size)})
    try:
        json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        return {"body": f"200 whose body is not UTF-8 JSON ({type(e).__name__})"}


@case("BYTES input data in the JSON body that is not UTF-8", protocols=("http",))
def http_json_bytes_input_not_utf8(c):
    # the model gets the bytes as they came: asked back as binary, they are the same
    body = (b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"BYTES","data":'
            b'["\xff\xfe","\xc3("]}],"outputs":[{"name":"OUTPUT0",'
            b'"parameters":{"binary_data":true}}]}')
    data = c.raw("POST", "/v2/models/err_bytes/infer", body)
    result = httpclient.InferenceServerClient.parse_response_body(
        data, header_length=len(data) - 12)  # the output: 4 + 2 and 4 + 2 bytes
    return {"body": repr(result.as_numpy("OUTPUT0").tolist())}


@case("an unknown shared_memory_region parameter in a JSON input", protocols=("http",))
def http_json_shm_unknown(c):
    body = _json_input()
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"shared_memory_region": "nope",
                                       "shared_memory_byte_size": 16}
    c.raw("POST", INFER, body)


@case("system shm register with a JSON body missing 'key'", protocols=("http",))
def http_shm_register_no_key(c):
    c.raw("POST", "/v2/systemsharedmemory/region/r/register", {"byte_size": 16})


@case("an unknown model's ready endpoint", protocols=("http",))
def http_model_ready_unknown(c):
    c.raw("GET", "/v2/models/no_such_model/ready")


# --- running --------------------------------------------------------------------------
def outcome_ok(protocol):
    return {"status": "ok"} if protocol == "http" else {"code": "OK"}


def outcome_of(protocol, err: tu.InferenceServerException) -> dict:
    status = err.status() or ""
    if protocol == "http":
        return {"status": int(status) if status.isdigit() else status,
                "message": err.message()}
    return {"code": status.removeprefix("StatusCode."), "message": err.message()}


def run_case(c: Case, protocol: str, http_url: str, grpc_url: str) -> dict:
    ctx = Ctx(protocol, http_url, grpc_url, c.id)
    try:
        extra = c.fn(ctx)
        out = outcome_ok(protocol)
    except tu.InferenceServerException as e:
        extra = None
        out = outcome_of(protocol, e)
    except Exception as e:  # noqa: BLE001 - no answer at all (a dropped connection)
        extra = None
        key = "status" if protocol == "http" else "code"
        out = {key: "no answer", "message": f"{type(e).__name__}: {e}"}
    finally:
        ctx.cleanup()
    if extra:
        out["after"] = extra
    return out


def run_table(http_url: str, grpc_url: str, only=None, skip=(), protocols=None) -> dict:
    """{case id: {"rule": ..., "http": outcome, "grpc": outcome}}."""
    table = {}
    for c in CASES:
        if (only and c.id not in only) or c.id in skip:
            continue
        row = {"rule": c.rule}
        for protocol in c.protocols:
            if protocols and protocol not in protocols:
                continue
            row[protocol] = run_case(c, protocol, http_url, grpc_url)
        table[c.id] = row
    return table
