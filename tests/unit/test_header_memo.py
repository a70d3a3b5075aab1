"""frontend.http_codec.HeaderMemo: a JSON header decoded before is not parsed or
validated again, and what it gives is what decoding afresh gives. The data plane is the
real one for the validation it keeps (its outbox records instead of sending)."""

import asyncio
import dataclasses

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from frontend import http_codec
from frontend.http_codec import HeaderMemo, decode_infer_request
from frontend.http_server import InferEndpoint
from shm.datatypes import serialize_bytes
from shm.errors import InferError
from shm.messages.frontend import InferRequest, ModelStateUpdate
from shm.messages.repository import ModelReadyState
from tests.unit.recording_plane import check_forwarded, count_validations, run_with_plane
from tests.unit.test_http_codec import client_body

pytestmark = pytest.mark.timeout(30)


def body(values, **kwargs):
    """tritonclient's body for INPUT0 = values, and its JSON header's length."""
    raw, header_length = client_body({"INPUT0": np.asarray(values, np.float32)},
                                     **kwargs)
    return raw, header_length


def fields(request):
    """A decoded request as plain values: its inputs' bytes, not their buffers."""
    out = dataclasses.asdict(dataclasses.replace(request, inputs=[], memo=None))
    out["inputs"] = [(i.name, i.datatype, i.shape, None if i.data is None
                      else bytes(i.data), i.parameters) for i in request.inputs]
    out.pop("checked")
    return out


def test_a_header_seen_before_decodes_to_what_decoding_afresh_gives():
    memo = HeaderMemo()
    first, length = body([[1, 2, 3, 4]], request_id="r1", sequence_id=7,
                         priority=2)
    again, length2 = body([[5, 6, 7, 8]], request_id="r1", sequence_id=7,
                          priority=2)
    assert length == length2 and first[:length] == again[:length]
    one, seen = memo.decode(first, length, "m", "1")
    two, seen2 = memo.decode(again, length, "m", "1")
    assert seen is not None and seen2 is seen  # the second was not parsed
    assert fields(two) == fields(decode_infer_request(again, length, "m", "1"))
    assert bytes(two.inputs[0].data) == np.float32([5, 6, 7, 8]).tobytes()
    assert bytes(one.inputs[0].data) == np.float32([1, 2, 3, 4]).tobytes()
    assert two.arena_blocks is not one.arena_blocks  # each its own


def test_the_model_version_and_body_length_are_part_of_what_is_remembered():
    memo = HeaderMemo()
    raw, length = body([[1, 2, 3, 4]])
    _, seen = memo.decode(raw, length, "m")
    assert memo.decode(raw, length, "other")[1] is not seen
    assert memo.decode(raw, length, "m", "2")[1] is not seen
    # the same header with a byte more: refused in Triton's words, as without a memo
    with pytest.raises(InferError, match="unexpected additional input data"):
        memo.decode(raw + b"\0", length, "m")
    with pytest.raises(InferError, match="expecting 1 additional bytes"):
        memo.decode(raw[:-1], length, "m")


def test_json_data_and_long_headers_are_not_kept():
    memo = HeaderMemo(max_bytes=400)
    raw, _ = body([[1, 2, 3, 4]], binary=False)
    request, seen = memo.decode(raw, None, "m")
    assert seen is None and not memo.seen
    assert bytes(request.inputs[0].data) == np.float32([1, 2, 3, 4]).tobytes()
    long_id = "x" * 500
    raw, length = body([[1, 2, 3, 4]], request_id=long_id)
    request, seen = memo.decode(raw, length, "m")
    assert seen is None and not memo.seen and request.id == long_id


def test_inputs_in_a_region_are_kept_as_the_region_names_them():
    memo = HeaderMemo()
    raw = (b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":'
           b'{"shared_memory_region":"r","shared_memory_byte_size":16}}]}')
    memo.decode(raw, None, "m")
    request, seen = memo.decode(raw, None, "m")
    assert seen is not None
    assert request.inputs[0].data is None
    assert request.inputs[0].parameters["shared_memory_region"] == "r"


def test_the_oldest_header_goes_first_when_the_memo_is_full():
    memo = HeaderMemo(entries=3)
    heads = []
    for i in range(4):
        raw, length = body([[1, 2, 3, 4]], request_id=f"r{i}")
        heads.append(memo.decode(raw, length, "m")[1])
    assert len(memo.seen) == 3
    assert heads[0] not in memo.seen.values()
    assert all(h in memo.seen.values() for h in heads[1:])


def config(datatype=model_config_pb2.TYPE_FP32, dims=4) -> model_config_pb2.ModelConfig:
    c = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    c.input.add(name="INPUT0", data_type=datatype, dims=[dims])
    c.output.add(name="OUTPUT0", data_type=datatype, dims=[dims])
    return c


def with_plane(tmp_path, test):
    run_with_plane(tmp_path, test, config().SerializeToString())


def test_validation_is_kept_for_the_same_config_and_done_again_for_another(
        tmp_path, monkeypatch):
    calls = count_validations(monkeypatch)

    async def test(plane):
        memo = HeaderMemo()
        raw, length = body([[1, 2, 3, 4], [5, 6, 7, 8]])
        for _ in range(3):
            request, seen = memo.decode(raw, length, "m")
            plane.start(request)
        assert len(calls) == 1  # checked once, its verdict kept
        assert plane.sent[-1][1].batch_size == 2
        # a reload brings another config: checked again against it
        plane.on_model_state(ModelStateUpdate("m", 1, ModelReadyState.READY,
                                              config=config().SerializeToString()))
        for _ in range(2):
            request, seen = memo.decode(raw, length, "m")
            plane.start(request)
        assert len(calls) == 2
        assert isinstance(plane.sent[-1][1], InferRequest)
    with_plane(tmp_path, test)


def test_a_request_refused_is_refused_every_time(tmp_path):
    async def test(plane):
        memo = HeaderMemo()
        raw, length = body([[1, 2, 3]])  # three elements where the model takes four
        for _ in range(3):
            request, seen = memo.decode(raw, length, "m")
            with pytest.raises(InferError, match="unexpected shape for input 'INPUT0'"):
                plane.start(request)
        assert not plane.sent
    with_plane(tmp_path, test)


def test_a_bytes_input_is_checked_every_time(tmp_path):
    """A BYTES input's length prefixes are in its bytes, not the header: the same
    header may come with bytes that do not hold the elements the shape says."""
    async def test(plane):
        plane.on_model_state(ModelStateUpdate(
            "m", 1, ModelReadyState.READY,
            config=config(model_config_pb2.TYPE_STRING).SerializeToString()))
        memo = HeaderMemo()
        good = serialize_bytes(np.array([b"ab", b"cd", b"ef", b"gh"], dtype=object))
        bad = b"\x09\0\0\0" + good[4:]  # the first element's length runs past the end
        assert len(bad) == len(good)
        header = (b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"BYTES",'
                  b'"parameters":{"binary_data_size":%d}}]}' % len(good))
        request, seen = memo.decode(header + good, len(header), "m")
        plane.start(request)
        request, seen = memo.decode(header + bad, len(header), "m")
        assert seen is not None and request.checked is None
        with pytest.raises(InferError, match="INPUT0"):
            plane.start(request)
    with_plane(tmp_path, test)


class ForwardCore:
    """A data plane that answers nothing and keeps the requests it is given."""

    stopping = False

    def __init__(self):
        self.requests = []

    async def infer(self, request, refusal=""):
        self.requests.append(request)
        raise InferError(http_codec.ErrorCode.UNAVAILABLE, "no model here")

    def body_buffer(self, *args):
        return None

    def body_quota(self):
        return None

    def free_blocks(self, blocks):
        pass


def test_forwarded_headers_do_not_stay_with_the_remembered_header():
    """--http-header-forward-pattern adds a request's headers to its parameters: the
    next request with the same JSON header gets its own headers, not these."""
    from shm.header_pattern import compile_forward_pattern
    core = ForwardCore()
    endpoint = InferEndpoint(core, compile_forward_pattern("x-.*"))
    raw, length = body([[1, 2, 3, 4]])

    async def send(value: bytes):
        class Watch:
            gone = False

            def stop(self):
                pass
        return await endpoint.respond("m", "", [(b"x-tag", value)], raw, None,
                                      str(length), None, None, Watch)
    asyncio.run(send(b"first"))
    asyncio.run(send(b"second"))
    first, second = core.requests
    assert first.parameters["x-tag"] == "first"
    assert second.parameters["x-tag"] == "second"
    assert all("x-tag" not in seen.parameters for seen in endpoint.memo.seen.values())


@pytest.mark.parametrize("pattern", ["", "x-.*"])
def test_forwarded_headers_are_validated_with_their_request(tmp_path, monkeypatch,
                                                            pattern):
    """Headers forwarded as parameters are not in the remembered header, and its
    verdict does not cover them: such requests are checked each time."""
    from shm.header_pattern import compile_forward_pattern
    calls = count_validations(monkeypatch)
    raw, length = body([[1, 2, 3, 4]])

    async def test(plane):
        endpoint = InferEndpoint(plane, compile_forward_pattern(pattern))
        for tag in (b"a", b"b", b"c"):
            request = endpoint.prepare("m", "", [(b"x-tag", tag)], raw, None,
                                       str(length))
            endpoint.start(request, lambda answer: None)
        check_forwarded(plane, calls, bool(pattern), ["a", "b", "c"])
    with_plane(tmp_path, test)


def test_a_request_the_reloaded_model_no_longer_takes_is_refused(tmp_path):
    """The verdict kept is for one config object: a reload whose config refuses the
    same header is heard, though the header was accepted many times before."""
    async def test(plane):
        memo = HeaderMemo()
        raw, length = body([[1, 2, 3, 4]])
        for _ in range(3):
            request, seen = memo.decode(raw, length, "m")
            plane.start(request)
        plane.on_model_state(ModelStateUpdate("m", 1, ModelReadyState.READY,
                                              config=config(dims=5).SerializeToString()))
        request, seen = memo.decode(raw, length, "m")
        assert seen.checked is not None  # the old verdict is still there...
        with pytest.raises(InferError, match="unexpected shape for input 'INPUT0'"):
            plane.start(request)  # ...and not taken for the new config
    with_plane(tmp_path, test)
