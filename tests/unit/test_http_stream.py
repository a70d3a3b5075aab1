"""Response streams without processes: the generate extension's request and response
mapping (Triton's http_server.cc rules), infer_stream framing, the frontend core's
per-request ResponseStream (ordering, input blocks freed at the final response,
cancellation) and the per-response statistics."""

import asyncio
import json
import struct

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from frontend.dataplane import ResponseStream
from frontend.http_stream import (_generate_shape, frame, generate_request,
                                  generate_response, read_frames)
from frontend.types import InferResult, ModelView, OutputTensor
from scheduler.stats import ModelStats
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest
from shm.messages.results import Error, InferResponse, ReleaseBlocks
from shm.tensor import TensorRef


def config(max_batch_size=0):
    return mc.ModelConfig(
        name="m", max_batch_size=max_batch_size,
        input=[mc.ModelInput(name="text_input", data_type=mc.TYPE_STRING, dims=[1]),
               mc.ModelInput(name="ids", data_type=mc.TYPE_INT32, dims=[2, -1])])


def test_generate_shape_follows_tritons_two_passes():
    # fixed dimensions take their share, the innermost variable one the rest
    assert _generate_shape("x", 6, [2, -1]) == [2, 3]
    assert _generate_shape("x", 4, [-1, 2, -1]) == [1, 2, 2]
    assert _generate_shape("x", 1, [1]) == [1]
    for count, dims in ((3, [2, -1]), (2, [1])):
        with pytest.raises(InferError) as exc:
            _generate_shape("x", count, dims)
        assert exc.value.message == ("The schema can not convert input 'x' to tensor "
                                     "with proper shape")


def test_generate_request_maps_keys_to_inputs_and_parameters():
    body = json.dumps({"id": "7", "text_input": "hi", "ids": [1, 2, 3, 4],
                       "temperature": 0.5, "parameters": {"stream": True, "top_k": 3}})
    req = generate_request(body.encode(), config(), "m", "")
    assert req.id == "7" and req.outputs is None
    inputs = {i.name: i for i in req.inputs}
    assert inputs["text_input"].shape == [1] and inputs["text_input"].datatype == "BYTES"
    assert bytes(inputs["text_input"].data) == struct.pack("<I", 2) + b"hi"
    assert inputs["ids"].shape == [2, 2]
    assert np.frombuffer(inputs["ids"].data, np.int32).tolist() == [1, 2, 3, 4]
    assert req.parameters == {"temperature": 0.5, "stream": True, "top_k": 3,
                              "binary_data_output": False}


def test_generate_request_batching_model_gets_batch_one():
    req = generate_request(b'{"text_input": "a"}', config(max_batch_size=8), "m", "")
    assert req.inputs[0].shape == [1, 1]


@pytest.mark.parametrize("body, text", [
    (b"{nope", "failed to parse the request JSON buffer"),
    (b"[1]", "generate request must be a JSON object"),
    (b'{"text_input": "a", "x": [1]}', "parameter 'x' has invalid type. It should be "
                                      "either 'int', 'bool', or 'string'."),
    (b'{"parameters": 3}', "Expected JSON object for keyword: 'parameters'"),
    (b'{"id": 5}', "Unable to parse 'id'"),
])
def test_generate_request_errors(body, text):
    with pytest.raises(InferError) as exc:
        generate_request(body, config(), "m", "")
    assert exc.value.code == ErrorCode.INVALID_ARG and text in exc.value.message


def test_generate_response_names_outputs_and_parameters():
    result = InferResult("m", "1", "r", [
        OutputTensor("text_output", "BYTES", [1], struct.pack("<I", 2) + b"ok"),
        OutputTensor("scores", "FP32", [2], np.array([1, 2], np.float32).tobytes())],
        parameters={"index": 3})
    assert json.loads(generate_response(result)) == {
        "id": "r", "model_name": "m", "model_version": "1", "index": 3,
        "text_output": "ok", "scores": [1.0, 2.0]}


def test_infer_stream_frames_round_trip():
    body = frame(b'{"a":1}xyz', 7) + frame(b'{"error":"e"}', 13)
    assert list(read_frames(body)) == [(7, b'{"a":1}xyz'), (13, b'{"error":"e"}')]


# ------------------------------------------------------------------ ResponseStream


class FakeArena:
    def __init__(self):
        self.freed = []

    def free(self, segment, offset):
        self.freed.append((segment, offset))

    def next_trim(self):
        return None  # nothing to give back


class FakeOutbox:
    def __init__(self):
        self.sent = []

    def send(self, address, msg):
        self.sent.append((address, msg))

    @property
    def loop(self):  # the real Outbox is given its loop when the core attaches
        return asyncio.get_running_loop()


class FakeSegments:
    def view(self, segment, offset, nbytes):
        return memoryview(b"\0" * nbytes)


def core_with_stream(rid=1, blocks=(("seg", 64),)):
    from frontend.body_budget import BodyBudget
    from frontend.dataplane import Laggards, SchedulerDataPlane

    core = SchedulerDataPlane.__new__(SchedulerDataPlane)
    core.arena, core.outbox, core.segments = FakeArena(), FakeOutbox(), FakeSegments()
    core.bodies = BodyBudget()
    core.address, core.scheduler = "fe", "sched"
    core.pending = {}
    core.waiting, core.laggards = 0, Laggards()
    core.idle = asyncio.Event()
    view = ModelView("m", 1, "READY", "", mc.ModelConfig(name="m"))
    from frontend.types import DecodedRequest
    request = DecodedRequest("m", "", "id", [], None, {})
    stream = ResponseStream(core, rid, view, request, list(blocks), None)
    core.pending[rid] = stream
    return core, stream


def out(rid, value, final=False, owner="w", **kw):
    return InferResponse(rid, [TensorRef("OUT", "INT32", [1], segment="ws", offset=value,
                                         nbytes=4)], final=final, owner=owner, **kw)


def test_stream_delivers_in_order_and_frees_inputs_at_the_final_response():
    async def run():
        core, stream = core_with_stream()
        core.on_response(out(1, 0))
        core.on_response(InferResponse(1, error=Error(ErrorCode.INVALID_ARG, "bad"), final=False))
        assert core.arena.freed == []  # not at the first response
        got = [await stream.next(), await stream.next()]
        core.on_response(InferResponse(1, final=True, empty=True))
        got.append(await stream.next())
        assert core.arena.freed == [("seg", 64)] and core.pending == {}
        assert core.idle.is_set()
        return got

    (r0, f0), (e1, f1), (last, f2) = asyncio.run(run())
    assert isinstance(r0, InferResult) and not f0
    assert isinstance(e1, InferError) and e1.code == ErrorCode.INVALID_ARG and not f1
    assert last is None and f2


def test_cancel_sends_cancel_request_and_releases_what_still_comes():
    async def run():
        core, stream = core_with_stream()
        waiter = asyncio.ensure_future(stream.next())
        await asyncio.sleep(0)
        waiter.cancel()  # the client went away while waiting
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert core.outbox.sent == [("sched", CancelRequest(1, "fe"))]
        core.on_response(out(1, 128))  # a response already on its way
        core.on_response(out(1, 256, final=True))
        return core

    core = asyncio.run(run())
    released = [m for _, m in core.outbox.sent if isinstance(m, ReleaseBlocks)]
    assert [m.blocks for m in released] == [[("ws", 128)], [("ws", 256)]]
    assert core.arena.freed == [("seg", 64)]  # inputs freed at the final all the same


def test_relayed_placeholder_is_ignored():
    async def run():
        core, stream = core_with_stream()
        core.on_response(InferResponse(1, final=False, empty=True))
        assert not stream.items
        core.on_response(out(1, 0, final=True))
        return await stream.next()

    result, final = asyncio.run(run())
    assert isinstance(result, InferResult) and final


# --------------------------------------------------------------- response statistics


def test_response_stats_count_by_index():
    stats = ModelStats("m", 1, histograms=False)
    stats.responses_sent([(0, 0, 100, 150, 170), (1, 1, 170, 200, 230),
                          (2, 2, 230, 260, 261)])
    stats.responses_sent([(0, 0, 10, 20, 30), (1, 2, 30, 35, 36)])
    rs = stats.as_json()["response_stats"]
    assert set(rs) == {"0", "1", "2"}
    assert rs["0"]["success"] == {"count": 2, "ns": 70 + 20}
    assert rs["0"]["compute_infer"] == {"count": 2, "ns": 50 + 10}
    assert rs["0"]["compute_output"] == {"count": 2, "ns": 20 + 10}
    assert rs["1"]["fail"] == {"count": 1, "ns": 60}
    assert rs["1"]["empty_response"] == {"count": 1, "ns": 5}
    assert rs["2"]["empty_response"] == {"count": 1, "ns": 30}
    assert rs["2"]["success"]["count"] == 0 and rs["2"]["cancel"] == {"count": 0, "ns": 0}


def test_response_stats_keep_the_first_indices_only():
    from shm.messages.worker import RESPONSE_STATS_INDICES
    stats = ModelStats("m", 1, histograms=False)
    last = RESPONSE_STATS_INDICES - 1
    stats.responses_sent([(last, 0, 0, 1, 2), (last + 1, 0, 2, 3, 4), (10**9, 2, 4, 5, 6)])
    assert set(stats.as_json()["response_stats"]) == {str(last)}
