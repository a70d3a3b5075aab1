"""A ModelInferRequest that repeats an earlier one's fields (grpc_codec's templates) is
not validated again: the template keeps the core's verdict, for the same model config
object and the same raw input sizes. Anything else is checked as a new request. The
data plane is the real one (its outbox records instead of sending)."""

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2

from frontend import grpc_codec
from frontend.grpc_server import InferenceServicer
from shm.datatypes import serialize_bytes
from shm.errors import InferError
from shm.header_pattern import compile_forward_pattern
from shm.messages.frontend import InferRequest, ModelStateUpdate
from shm.messages.repository import ModelReadyState
from tests.unit.recording_plane import check_forwarded, count_validations, run_with_plane
from tests.unit.test_header_memo import config

pytestmark = pytest.mark.timeout(30)


def message(raw: bytes, datatype="FP32", shape=(2, 4), request_id="") -> bytes:
    """tritonclient's ModelInferRequest for model m, INPUT0 in raw_input_contents."""
    msg = service_pb2.ModelInferRequest(model_name="m", id=request_id)
    msg.inputs.add(name="INPUT0", datatype=datatype, shape=list(shape))
    msg.outputs.add(name="OUTPUT0")
    msg.raw_input_contents.append(raw)
    return msg.SerializeToString()


@pytest.fixture
def validations(monkeypatch):
    """The configs validate_request was called with, one entry a call."""
    grpc_codec._REQUESTS.clear()
    yield count_validations(monkeypatch)
    grpc_codec._REQUESTS.clear()


def start(plane, data: bytes):
    """What the servicer does with a ModelInfer message: decode, start."""
    request = grpc_codec.decode_infer_request(data)
    plane.start(request)
    return request


def with_plane(tmp_path, test, datatype=model_config_pb2.TYPE_FP32):
    run_with_plane(tmp_path, test, config(datatype).SerializeToString())


def test_a_repeated_request_is_validated_once_and_other_sizes_again(tmp_path,
                                                                     validations):
    good = np.arange(8, dtype=np.float32).tobytes()

    async def test(plane):
        for i in range(3):  # the id differs, the fields do not
            start(plane, message(good, request_id=f"r{i}"))
        assert len(validations) == 1
        assert plane.sent[-1][1].batch_size == 2 and plane.sent[-1][1].id
        # the same fields with 4 bytes less: checked, and refused
        with pytest.raises(InferError, match="Expected 32, got 28"):
            start(plane, message(good[:28]))
        assert len(validations) == 2
        # the sizes of the verdict again: it stands
        start(plane, message(good))
        assert len(validations) == 2
        # a reload brings another config object: checked against it
        plane.on_model_state(ModelStateUpdate("m", 1, ModelReadyState.READY,
                                              config=config().SerializeToString()))
        start(plane, message(good))
        start(plane, message(good))
        assert len(validations) == 3
        assert isinstance(plane.sent[-1][1], InferRequest)
    with_plane(tmp_path, test)


def test_a_request_the_reloaded_model_no_longer_takes_is_refused(tmp_path, validations):
    good = np.arange(8, dtype=np.float32).tobytes()

    async def test(plane):
        for _ in range(2):
            start(plane, message(good))
        plane.on_model_state(ModelStateUpdate("m", 1, ModelReadyState.READY,
                                              config=config(dims=5).SerializeToString()))
        request = grpc_codec.decode_infer_request(message(good))
        assert request.checked is not None  # the old verdict comes with it...
        with pytest.raises(InferError, match="unexpected shape for input 'INPUT0'"):
            plane.start(request)  # ...and is not taken for the new config
    with_plane(tmp_path, test)


def test_a_bytes_input_is_checked_every_time(tmp_path, validations):
    """A BYTES input's length prefixes are in its bytes: the same fields and size may
    come with bytes that do not hold the elements the shape says."""
    good = serialize_bytes(np.array([b"ab", b"cd", b"ef", b"gh"], dtype=object))
    bad = b"\x09\0\0\0" + good[4:]  # the first element's length runs past the end

    async def test(plane):
        start(plane, message(good, "BYTES", (1, 4)))
        request = grpc_codec.decode_infer_request(message(bad, "BYTES", (1, 4)))
        assert request.memo is not None and request.checked is None
        with pytest.raises(InferError, match="INPUT0"):
            plane.start(request)
        assert len(validations) == 2
    with_plane(tmp_path, test, model_config_pb2.TYPE_STRING)


class Context:
    """The call as the servicer sees it: the client's metadata."""

    def __init__(self, metadata):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


@pytest.mark.parametrize("pattern", ["", "x-.*"])
def test_forwarded_metadata_is_validated_with_its_request(tmp_path, validations,
                                                           pattern):
    """--grpc-header-forward-pattern makes metadata parameters, which the template's
    verdict (for a request with none) does not cover: such requests are checked each
    time, and carry their own metadata."""
    good = np.arange(8, dtype=np.float32).tobytes()

    async def test(plane):
        servicer = InferenceServicer(plane, "shmserve", "0", [],
                                     compile_forward_pattern(pattern))
        answers = []
        for tag in ("a", "b", "c"):
            handle = servicer.start_model_infer(
                message(good), Context([("x-tag", tag)]),
                lambda *answer: answers.append(answer))
            assert handle is not None and not answers
        check_forwarded(plane, validations, bool(pattern), ["a", "b", "c"])
    with_plane(tmp_path, test)


def test_forwarded_metadata_of_a_streamed_request_is_validated_with_it(tmp_path,
                                                                       validations):
    """ModelStreamInfer's requests decode from the same templates: one whose
    forwarded metadata added parameters is checked with them."""
    import asyncio
    good = np.arange(8, dtype=np.float32).tobytes()

    async def write(reply):
        pass

    async def test(plane):
        servicer = InferenceServicer(plane, "shmserve", "0", [],
                                     compile_forward_pattern("x-.*"))
        start(plane, message(good))  # a unary call with no metadata leaves a verdict
        start(plane, message(good))
        assert len(validations) == 1
        for tag in ("a", "b", "c"):
            run = asyncio.ensure_future(servicer._stream_one(
                message(good), write, [("x-tag", tag)]))
            for _ in range(3):  # started, now waiting for its responses
                await asyncio.sleep(0)
            run.cancel()
        sent = [m for _, m in plane.sent if isinstance(m, InferRequest)][2:]
        assert [m.parameters["x-tag"] for m in sent] == ["a", "b", "c"]
        assert len(validations) == 4
    with_plane(tmp_path, test)
