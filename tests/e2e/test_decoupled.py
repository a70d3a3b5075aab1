"""Decoupled models end to end (Triton's `user_guide/decoupled_models.md` and the python
backend's response sender): zero, one and many responses per request over the gRPC
stream and the HTTP streaming routes, responses sent from a thread after execute()
returned, an error response mid-stream, unary inference refused as Triton refuses it,
sending after the final flag raising Triton's error in the model, and nothing left
behind in shared memory."""

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from frontend.http_stream import read_frames
from tests.e2e.clients import GrpcStream, is_final as _final
from tests.e2e import clients
from tests.e2e.harness import MODELS, ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

DECOUPLED = ROOT / "tests" / "models_decoupled"
T = 60  # seconds: a bound on every wait, never a pace


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess((DECOUPLED, MODELS), log_dir=tmp_path_factory.mktemp("dec-logs"))
    yield from srv.serve()


class Stream(GrpcStream):
    def send(self, values, request_id="", empty_final=True, model="repeat", **params):
        x = np.array(values, dtype=np.int32)
        inp = grpcclient.InferInput("IN" if model == "repeat" else "INPUT0",
                                    list(x.shape), "INT32")
        inp.set_data_from_numpy(x)
        self.client.async_stream_infer(model, [inp], request_id=request_id,
                                       parameters=params or None,
                                       enable_empty_final_response=empty_final)


@pytest.fixture
def stream(server):
    s = Stream(server)
    yield s
    s.close()


@pytest.mark.parametrize("n", [0, 1, 5])
def test_grpc_stream_zero_one_and_n_responses(stream, n):
    """Rule: a decoupled model answers a request with as many responses as it sends,
    each as it is produced, the last (an empty final here, sent only because the
    request set triton_enable_empty_final_response) carrying triton_final_response."""
    stream.send(list(range(10, 10 + n)), request_id=f"r{n}")
    got = stream.until_final()
    assert len(got) == n + 1
    assert all(e is None for _, e in got)
    for i, (r, _) in enumerate(got[:-1]):
        assert r.get_response().id == f"r{n}"
        assert not _final(r)
        assert r.as_numpy("OUT").tolist() == [10 + i]
        assert r.as_numpy("IDX").tolist() == [i]
    last = got[-1][0].get_response()
    assert last.id == f"r{n}" and last.model_name == "repeat" and not last.outputs
    assert last.model_version == ""  # as the request spelled it (Triton's choice)


def test_grpc_stream_without_empty_final_sends_only_responses(stream):
    """Rule: without triton_enable_empty_final_response, send(None, FINAL) sends
    nothing: a request of 0 responses is silent, one of 2 gets exactly 2, and the
    stream carries on with the next request."""
    stream.send([], request_id="silent", empty_final=False)
    stream.send([7, 8], request_id="two", empty_final=False)
    stream.send([9], request_id="end")  # with its empty final: marks where to stop
    got = stream.until_final()
    ids = [r.get_response().id for r, _ in got]
    assert "silent" not in ids
    assert ids.count("two") == 2 and ids.count("end") == 2


def test_grpc_stream_error_mid_stream_keeps_stream_open(stream):
    """Rule: an error response of a decoupled model travels in the stream, in
    error_message, and neither ends the request nor closes the stream."""
    stream.send([1, -1, 3], request_id="err")
    got = stream.until_final()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "element 1 is -1" in errors[0].message()
    values = [r.as_numpy("OUT").tolist() for r, e in got if e is None and r.as_numpy("OUT")
              is not None]
    assert values == [[1], [3]]
    stream.send([4], request_id="after")  # the same stream still serves
    got = stream.until_final()
    assert got[0][0].as_numpy("OUT").tolist() == [4]


@pytest.mark.parametrize("from_thread", [False, True])
def test_responses_go_out_as_produced_not_gathered(stream, tmp_path, from_thread):
    """Rule: each response of a decoupled model reaches the client as soon as the
    model sends it: the model holds its second response until the client has the
    first (a file the test creates), so gathering responses would never finish."""
    gate = tmp_path / "got-first"
    stream.send([1, 2, 3], request_id="gate", gate=str(gate), from_thread=from_thread)
    r, e = stream.responses.get(timeout=T)
    assert e is None and r.as_numpy("OUT").tolist() == [1]
    gate.touch()
    rest = stream.until_final()
    assert [x.as_numpy("OUT").tolist() for x, _ in rest[:-1]] == [[2], [3]]


def test_grpc_stream_responses_from_a_thread_after_execute(stream):
    """Rule: a decoupled model may send its responses from a thread of its own after
    execute() returned; they reach the client as it sends them."""
    stream.send([5, 6, 7], request_id="th", from_thread=True, delay_ms=20)
    got = stream.until_final()
    assert [r.as_numpy("OUT").tolist() for r, _ in got[:-1]] == [[5], [6], [7]]


def test_interleaved_requests_on_one_stream(stream):
    """Rule: several requests in flight on one stream each get all their responses,
    matched by id."""
    for k in range(3):
        stream.send([k] * 4, request_id=f"i{k}")
    finals, seen = 0, {}
    while finals < 3:
        r, e = stream.responses.get(timeout=T)
        assert e is None
        rid = r.get_response().id
        if _final(r):
            finals += 1
        else:
            seen.setdefault(rid, []).append(int(r.as_numpy("OUT")[0]))
    assert seen == {f"i{k}": [k] * 4 for k in range(3)}


def test_sending_after_final_raises_tritons_error_in_the_model(stream):
    """Rule: once a response sender sent the final flag, a further send raises in the
    model (Triton: "Unable to send response. Response sender has been closed."), and
    the server goes on serving."""
    stream.send([1], request_id="af", after_final=True)
    stream.until_final()
    stream.send([], request_id="rep", report=True)
    (r, e), = stream.until_final()
    assert e is None
    report = r.as_numpy("REPORT")[0].decode()
    assert "Response sender has been closed" in report, report


def test_unary_inference_on_decoupled_model_is_refused(server):
    """Rule: ModelInfer and HTTP /infer refuse decoupled models with Triton's texts
    (UNSUPPORTED), and the server keeps serving."""
    x = np.array([1, 2], dtype=np.int32)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    gi = grpcclient.InferInput("IN", [2], "INT32")
    gi.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        g.infer("repeat", [gi])
    assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
    assert exc.value.message() == ("ModelInfer RPC doesn't support models with decoupled "
                                   "transaction policy")
    h = clients.HttpClient(server.http_url)
    hi = httpclient.InferInput("IN", [2], "INT32")
    hi.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        h.infer("repeat", [hi])
    assert exc.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" \
        in exc.value.message()
    assert h.is_server_live() and g.is_model_ready("repeat")


def test_non_decoupled_model_using_its_response_sender(server):
    """Rule: a non-decoupled model may answer through its response sender (one
    response, then the final flag); a second response raises in the model and the
    client still gets exactly the first, over unary and stream alike."""
    x = np.array([3, 4], dtype=np.int32)
    for twice in (False, True):
        h = clients.HttpClient(server.http_url)
        inp = httpclient.InferInput("INPUT0", [2], "INT32")
        inp.set_data_from_numpy(x)
        r = h.infer("nondecoupled_sender", [inp], parameters={"twice": twice})
        assert r.as_numpy("OUTPUT0").tolist() == [3, 4]


def _index(result) -> tuple[int, int, str]:
    return (int(result.as_numpy("INDEX").reshape(-1)[0]),
            int(result.as_numpy("N").reshape(-1)[0]), result.get_response().id)


def test_non_decoupled_response_sender_as_triton_allows_it(stream):
    """Rule (Triton's python backend, its qa L0_backend_python response_sender cases):
    a non-decoupled model answers each request of one execute() its own way: returned,
    sent before execute() returns, or sent from a thread after it returned (the list's
    place None, or None for the whole batch); a response after the first is dropped
    (a send after a returned one raises in the model; a second send raises and the
    client still gets the first). One response per request, no error."""
    def batch(*cases):
        for i, params in enumerate(cases):
            stream.send([[7]], request_id=str(i), model="response_sender", **params)
        got = sorted((_index(r) for r, e in
                      [stream.responses.get(timeout=stream.timeout) for _ in cases]
                      if e is None or pytest.fail(str(e))), key=lambda t: t[2])
        assert all(n == len(cases) for _, n, _ in got), got  # one execute() ran them
        return [index for index, _, _ in got]

    # one returned, one sent before the return, one sent after it
    assert batch({"ret": True}, {"pre": 1, "pre_final": True},
                 {"post": 1, "post_final": True}) == [0, 1000, 2000]
    # sent and also returned: the sent one. Returned and also sent from the thread:
    # whichever comes first (the thread may beat the return), never both
    sent, either, post = batch({"pre": 1, "pre_final": True, "ret": True},
                               {"ret": True, "post": 1, "post_final": True},
                               {"post": 1, "post_final": True})
    assert (sent, post) == (1000, 2000) and either in (0, 2000)
    # two sent: the second raises (uncaught, execute() fails); the client gets the
    # first, and no second answer came for a request before (the stream's next answer
    # is this one: its N is 1)
    assert batch({"pre": 2, "pre_final": True}) == [1000]


def _post(server, path, body: bytes, headers=None):
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=body,
                                 headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=T) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _infer_body(values, **params):
    return json.dumps({"inputs": [{"name": "IN", "datatype": "INT32",
                                   "shape": [len(values)], "data": values}],
                       "parameters": params}).encode()


@pytest.mark.parametrize("n", [0, 1, 4])
def test_http_infer_stream_binary_frames(server, n):
    """Rule (shmserve's route): POST .../infer_stream answers every response of a
    decoupled model as a frame in the binary tensor format that tritonclient decodes,
    the body ending with the request (an empty final adds no frame)."""
    values = list(range(100, 100 + n))
    status, headers, body = _post(server, "/v2/models/repeat/infer_stream",
                                  _infer_body(values, binary_data_output=True))
    assert status == 200
    assert headers["content-type"] == "application/vnd.shmserve.infer-stream"
    frames = list(read_frames(body))
    assert len(frames) == n
    for i, (hlen, data) in enumerate(frames):
        r = httpclient.InferResult.from_response_body(data, header_length=hlen)
        assert r.as_numpy("OUT").tolist() == [100 + i]
        assert r.get_response()["parameters"]["triton_final_response"] is False


def test_http_infer_stream_error_mid_stream(server):
    """Rule: an error response is a frame with {"error": ...}; later responses of the
    request still come."""
    status, _, body = _post(server, "/v2/models/repeat/infer_stream",
                            _infer_body([1, -1, 2]))
    assert status == 200
    frames = [json.loads(d[:h]) for h, d in read_frames(body)]
    assert [f.get("error") for f in frames] == [None, "element 1 is -1", None]
    assert frames[2]["outputs"][0]["data"] == [2]


def test_http_infer_stream_refuses_bad_requests_before_starting(server):
    """Rule: a request refused before it runs is an ordinary JSON error with status."""
    status, _, body = _post(server, "/v2/models/nope/infer_stream", _infer_body([1]))
    assert status == 404 and b"unknown model" in body


def test_generate_stream_sends_server_sent_events(server):
    """Rule (extension_generate.md): generate_stream answers each response as an SSE
    'data:' event as it is produced, text/event-stream, with the output and the
    response parameters by name; generate gives the one body."""
    body = json.dumps({"id": "g1", "text_input": "alpha beta gamma",
                       "parameters": {"suffix": "!"}}).encode()
    status, headers, out = _post(server, "/v2/models/text_echo/generate_stream", body)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = [json.loads(chunk[len(b"data: "):]) for chunk in out.split(b"\n\n") if chunk]
    assert [e["text_output"] for e in events] == ["alpha!", "beta!", "gamma!"]
    assert [e["index"] for e in events] == [0, 1, 2]
    assert all(e["id"] == "g1" and e["model_name"] == "text_echo"
               and e["model_version"] == "1" for e in events)
    one = json.dumps({"text_input": "solo"}).encode()
    status, headers, out = _post(server, "/v2/models/text_echo/generate", one)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(out) == {"model_name": "text_echo", "model_version": "1",
                               "index": 0, "text_output": "solo"}


def test_generate_wants_exactly_one_response(server):
    """Rule (Triton 2.51): /generate answers a model's one response (data or error,
    with its status; the empty final does not count) and refuses none or several with
    its error text (status of the first response); generate_stream sends them all."""
    one = _post(server, "/v2/models/repeat/generate", b'{"IN": [5]}')
    assert one[0] == 200 and json.loads(one[2]) == {
        "model_name": "repeat", "model_version": "1", "OUT": 5, "IDX": 0}
    err = _post(server, "/v2/models/repeat/generate", b'{"IN": [-1]}')
    # the status is the error code's (how pb_utils.TritonError codes map is BLS work's)
    assert err[0] >= 400 and json.loads(err[2]) == {"error": "element 0 is -1"}
    text = ("generate expects model to produce exactly 1 response, use generate stream "
            "for model that generates various number of responses")
    for body in (b'{"IN": []}', b'{"IN": [1, 2]}'):
        status, _, out = _post(server, "/v2/models/repeat/generate", body)
        assert status == 200 and json.loads(out) == {"error": text}
    status, _, out = _post(server, "/v2/models/repeat/generate_stream", b'{"IN": []}')
    assert status == 200 and out == b""


def test_generate_errors(server):
    """Rule: a generate request refused before it runs is a JSON error with an error
    status; a missing input is the core's error."""
    status, _, out = _post(server, "/v2/models/text_echo/generate", b"{not json")
    assert status == 400 and "error" in json.loads(out)
    status, _, out = _post(server, "/v2/models/text_echo/generate",
                           json.dumps({"parameters": {"x": 1}}).encode())
    assert status == 400 and "text_input" in json.loads(out)["error"]
    status, _, out = _post(server, "/v2/models/text_echo/generate_stream",
                           json.dumps({"text_input": "a", "bad": [1, 2]}).encode())
    assert status == 400 and "invalid type" in json.loads(out)["error"]


def _response_stats(server):
    s = clients.HttpClient(server.http_url).get_inference_statistics("repeat")
    return s["model_stats"][0]["response_stats"]


def test_response_statistics_count_each_response_by_index(server, stream):
    """Rule (statistics extension, response_stats): a decoupled model's responses are
    counted by their index across requests: success or fail with compute_infer and
    compute_output, the empty final as empty_response; over gRPC too."""
    before = _response_stats(server)
    stream.send([1, -1, 3], request_id="stats")
    stream.until_final()

    def count(stats, index, kind):
        return stats.get(str(index), {}).get(kind, {}).get("count", 0)

    def settled():
        now = _response_stats(server)
        return count(now, 3, "empty_response") == count(before, 3, "empty_response") + 1

    wait_until(settled, T, what="the request's response statistics")
    after = _response_stats(server)
    for index, kind in ((0, "success"), (1, "fail"), (2, "success"), (3, "empty_response")):
        assert count(after, index, kind) == count(before, index, kind) + 1, (index, kind)
    assert count(after, 0, "compute_infer") == count(before, 0, "compute_infer") + 1
    assert after["0"]["success"]["ns"] > before.get("0", {}).get("success", {}).get("ns", 0)
    g = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("repeat")
    assert g.model_stats[0].response_stats["3"].empty_response.count == \
        after["3"]["empty_response"]["count"]


def test_a_client_that_reads_no_responses_has_its_request_cancelled_not_held(server):
    """A client whose windows are shut (it reads nothing) asks `repeat` for 60,000
    responses: the frontend holds what the transport takes (1 MiB of the stream's
    answers) and what waits behind, until UNREAD_MAX have waited UNREAD_STALL
    seconds; then it cancels the request and releases those and the rest as the model
    sends them, so its memory stays bounded. Once the client opens its windows it
    reads what the transport held, then the error in-band, and the stream stays
    open. (test_a_client_reading_a_long_stream_slowly_gets_all_of_it is the other
    side.)"""
    import struct

    from tritonclient.grpc import service_pb2

    from frontend.transport import h2
    from tests.e2e.h2raw import RawH2, grpc_message, request_block
    from tests.e2e.test_h2_attacks import frontend_rss_kib

    rss = frontend_rss_kib(server)
    a = RawH2(server.grpc_port, settings=struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 0))
    a.read()
    n = 60_000
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="IN", datatype="INT32",
                                                           shape=[n])
    request = service_pb2.ModelInferRequest(
        model_name="repeat", id="flood", inputs=[tensor],
        raw_input_contents=[np.arange(n, dtype=np.int32).tobytes()]).SerializeToString()
    a.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, request_block(
        a.encoder, "/inference.GRPCInferenceService/ModelStreamInfer"))
        + h2.frame(h2.DATA, 0, 1, grpc_message(request)))
    wait_until(lambda: "waited for a client that read none of them" in server.log(), T,
               what="the request to be given up")
    assert frontend_rss_kib(server) - rss < 100 * 1024
    # the windows open: what was held comes, then the error, on the stream still open
    a.send(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 1 << 30))
           + h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))

    def replies():
        body = b"".join(p for kind, _, sid, p in list(a.frames)
                        if kind == h2.DATA and sid == 1)
        out, pos = [], 0
        while len(body) - pos >= 5:
            size = struct.unpack_from(">I", body, pos + 1)[0]
            if len(body) - pos - 5 < size:
                break
            out.append(service_pb2.ModelStreamInferResponse.FromString(
                body[pos + 5:pos + 5 + size]))
            pos += 5 + size
        return out

    wait_until(lambda: any(r.error_message for r in replies()), T, what="the error")
    got = replies()
    assert "waited for a client that read none of them for 5 s" in got[-1].error_message
    # before it, in order, what the transport had taken; the rest was dropped
    indices = [struct.unpack("<I", r.infer_response.raw_output_contents[1])[0]
               for r in got[:-1]]
    assert indices == list(range(len(indices))) and len(indices) < n // 2
    assert not a.ended.is_set() and a.goaway_code() is None
    a.close()


def test_a_client_that_pauses_reading_a_long_stream_gets_all_of_it(server):
    """The other side of the bound above: a tritonclient stream whose reader stops
    for 2 s at its first response (a pause, shorter than UNREAD_STALL) while `repeat`
    sends 20,000, thousands more than UNREAD_MAX waiting beyond what the transport
    holds. It gets every response, in order, and the request is not given up."""
    import queue
    import threading

    got: queue.Queue = queue.Queue()
    first = threading.Event()

    def callback(result, error):
        if not first.is_set():
            first.set()
            threading.Event().wait(2.0)  # the pause: gRPC's reader thread stops here
        got.put((result, error))

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    try:
        n = 20_000
        inp = grpcclient.InferInput("IN", [n], "INT32")
        inp.set_data_from_numpy(np.arange(n, dtype=np.int32))
        client.async_stream_infer("repeat", [inp], request_id="long",
                                  enable_empty_final_response=True)
        indices = []
        while True:
            result, error = got.get(timeout=T)
            assert error is None, error
            if _final(result):
                break
            indices.append(int(result.as_numpy("IDX")[0]))
        assert indices == list(range(n))
    finally:
        client.stop_stream()
        client.close()
    assert "request long of model 'repeat'" not in server.log()  # never given up
