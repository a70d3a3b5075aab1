"""SchedulerDataPlane.start_unary: infer() without a coroutine, as HTTP's fast path
uses it. The answer reaches on_done from the read of the final response, once; a
request cancelled meanwhile gets no answer and leaves nothing behind. The data plane is
the real one; its outbox records instead of sending."""

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from frontend.types import DecodedInput, DecodedRequest, InferResult
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest, InferRequest
from shm.messages.results import Error, InferResponse
from shm.tensor import TensorRef
from tests.unit.recording_plane import run_with_plane

pytestmark = pytest.mark.timeout(30)


def config(decoupled: bool = False) -> bytes:
    c = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    c.input.add(name="IN", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    c.output.add(name="OUT", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    c.model_transaction_policy.decoupled = decoupled
    return c.SerializeToString()


def request() -> DecodedRequest:
    inp = DecodedInput("IN", "FP32", [1, 4], np.arange(4, dtype=np.float32).tobytes())
    return DecodedRequest("m", "", "r", [inp], None, {})


def run(tmp_path, test, decoupled: bool = False):
    run_with_plane(tmp_path, test, config(decoupled))


def output(k: int) -> TensorRef:
    return TensorRef("OUT", "FP32", [1, 4], data=np.full(4, k, np.float32).tobytes())


def test_the_final_response_is_handed_to_on_done_once(tmp_path):
    async def test(plane):
        answers = []
        stream = plane.start_unary(request(), answers.append)
        to, sent = plane.sent[-1]
        assert to == "ipc://sched" and isinstance(sent, InferRequest)
        assert not answers  # nothing until the response is read
        plane.on_response(InferResponse(stream.rid, outputs=[output(7)]))
        assert len(answers) == 1 and isinstance(answers[0], InferResult)
        assert np.frombuffer(answers[0].outputs[0].data, np.float32).tolist() == [7] * 4
        assert not plane.pending and plane.idle.is_set()
        plane.on_response(InferResponse(stream.rid, outputs=[output(8)]))  # a stray
        assert len(answers) == 1
    run(tmp_path, test)


def test_an_error_response_is_the_answer(tmp_path):
    async def test(plane):
        answers = []
        stream = plane.start_unary(request(), answers.append)
        plane.on_response(InferResponse(stream.rid, error=Error(ErrorCode.INTERNAL,
                                                                "the model failed")))
        (answer,) = answers
        assert isinstance(answer, InferError) and answer.message == "the model failed"
    run(tmp_path, test)


def test_responses_before_the_final_one_are_released_unanswered(tmp_path):
    async def test(plane):
        answers, released = [], []
        build = plane._result

        def result(view, req, msg):  # each result notes its release
            out = build(view, req, msg)
            out.release = lambda: released.append(out)
            return out
        plane._result = result
        stream = plane.start_unary(request(), answers.append)
        plane.on_response(InferResponse(stream.rid, outputs=[output(0)], final=False))
        assert not answers and len(released) == 1
        plane.on_response(InferResponse(stream.rid, outputs=[output(1)]))
        (answer,) = answers
        assert answer is not released[0] and len(released) == 1  # the answer's: later
    run(tmp_path, test)


def test_a_cancelled_request_gets_no_answer(tmp_path):
    async def test(plane):
        answers = []
        stream = plane.start_unary(request(), answers.append)
        stream.cancel()  # the client went away
        assert plane.sent[-1] == ("ipc://sched", CancelRequest(stream.rid, plane.address))
        plane.on_response(InferResponse(stream.rid, error=Error(ErrorCode.CANCELLED,
                                                                "cancelled")))
        assert not answers and not plane.pending
    run(tmp_path, test)


def test_the_stop_answers_what_is_pending(tmp_path):
    async def test(plane):
        answers = []
        plane.start_unary(request(), answers.append)
        plane.fail_pending()
        (answer,) = answers
        assert isinstance(answer, InferError) and answer.code == ErrorCode.UNAVAILABLE
    run(tmp_path, test)


def test_a_refused_request_raises_at_once(tmp_path):
    async def test(plane):
        answers = []
        with pytest.raises(InferError, match="decoupled"):
            plane.start_unary(request(), answers.append, "no decoupled models here")
        assert not answers and not plane.pending and not plane.sent
    run(tmp_path, test, decoupled=True)
