"""Messages on the wire: tensor bytes stay out of control messages."""

import os
import typing

import msgspec
import pytest

from frontend.dataplane import put_inputs
from frontend.types import DecodedInput
from scheduler.scheduling.queued import Queued
from shm.arena import Arena
from shm.channel import encode
from shm.errors import ErrorCode
from shm.messages.frontend import (FRONTEND_INBOX, InferRequest, ModelStateUpdate,
                                   RequestOrigin, StatsReply)
from shm.messages.regions import RegionReply
from shm.messages.repository import ModelReadyState, RepositoryReply
from shm.messages.results import Error, InferResponse
from shm.messages.settings import LogSettingsReply, TraceSettingReply
from shm.messages.scheduler import SCHEDULER_INBOX
from shm.messages.worker import WORKER_INBOX, BatchDone, ExecuteBatch
from shm.tensor import INLINE_MAX


@pytest.fixture
def arena():
    a = Arena(f"shmserve-msgtest-{os.getpid()}", chunk_size=1 << 20)
    yield a
    a.close()


def test_64mib_input_travels_as_a_few_hundred_bytes(arena):
    body = bytearray(64 << 20)
    body[-1] = 7
    refs, blocks = put_inputs(arena, [DecodedInput("INPUT0", "FP32", [1, 16 << 20],
                                                   memoryview(body))])
    req = InferRequest(1, "ipc:///tmp/shmserve-x/f0g1", "identity_fp32", 1, refs)
    wire = encode(req)
    assert len(wire) < 300, len(wire)
    # ...and the scheduler passes it to the worker still as a descriptor
    assert len(encode(ExecuteBatch(1, "identity_fp32/1/identity_fp32_0_0", [req]))) < 400
    seg, off = blocks[0]
    assert arena.segments[seg].view[off + (64 << 20) - 1] == 7  # the bytes are in shm


def test_small_inputs_are_inline(arena):
    refs, blocks = put_inputs(arena, [DecodedInput("A", "INT8", [INLINE_MAX], bytes(INLINE_MAX))])
    assert refs[0].data is not None and blocks == []
    refs, blocks = put_inputs(arena, [DecodedInput("A", "INT8", [INLINE_MAX + 1],
                                                   bytes(INLINE_MAX + 1))])
    assert refs[0].data is None and len(blocks) == 1


def test_round_trip_through_the_typed_decoder(arena):
    refs, _ = put_inputs(arena, [DecodedInput("A", "FP32", [1, 2], bytes(8))])
    req = InferRequest(5, "ipc://x", "m", 0, refs, request_id="abc", sequence_id="s1",
                       sequence_start=True, priority=2, timeout_us=100)
    decoder = msgspec.msgpack.Decoder(typing.Union[SCHEDULER_INBOX])
    assert decoder.decode(encode(req)) == req


def test_an_inbox_rejects_types_it_does_not_expect():
    decoder = msgspec.msgpack.Decoder(typing.Union[WORKER_INBOX])
    req = InferRequest(1, "ipc://x", "m", 0, [])
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(encode(req))  # workers get ExecuteBatch, never a bare request
    with pytest.raises(msgspec.DecodeError):
        decoder.decode(b"\x93garbage")


def test_a_model_state_travels_as_its_name_and_only_a_known_one_decodes():
    decoder = msgspec.msgpack.Decoder(typing.Union[FRONTEND_INBOX])
    update = ModelStateUpdate("m", 1, ModelReadyState.READY)
    frame = encode(update)
    assert b"READY" in frame  # a StrEnum keeps the bytes a plain string had
    assert decoder.decode(frame).state is ModelReadyState.READY
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(frame.replace(b"READY", b"READX"))


def test_a_request_carries_its_origin_and_only_a_known_one_decodes():
    decoder = msgspec.msgpack.Decoder(typing.Union[SCHEDULER_INBOX])
    assert decoder.decode(encode(InferRequest(1, "x", "m", 0, []))).origin \
        is RequestOrigin.CLIENT
    frame = encode(InferRequest(1, "x", "m", 0, [], origin=RequestOrigin.BLS))
    assert decoder.decode(frame).origin is RequestOrigin.BLS
    assert frame.endswith(b"\x01")  # the last field: one byte on the wire
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(frame[:-1] + b"\x7f")


@pytest.mark.parametrize("reply", [
    InferResponse(1), StatsReply(1), RegionReply(1), RepositoryReply(1),
    LogSettingsReply(1), TraceSettingReply(1)])
def test_every_reply_that_can_fail_carries_one_error_struct(reply):
    decoder = msgspec.msgpack.Decoder(typing.Union[FRONTEND_INBOX])
    assert decoder.decode(encode(reply)).error is None
    failed = msgspec.structs.replace(reply, error=Error(ErrorCode.NOT_FOUND, "gone"))
    assert decoder.decode(encode(failed)).error == Error(ErrorCode.NOT_FOUND, "gone")
    bogus = encode(msgspec.structs.replace(reply, error=Error(99, "gone")))
    with pytest.raises(msgspec.ValidationError):  # only Triton's error classes decode
        decoder.decode(bogus)


def test_messages_nobody_updates_are_frozen_and_the_working_ones_are_not():
    # a receiver that changed a control message or a state update would change what
    # another handler (or a retry) sees; batches are updated in place on purpose
    # (quiet, timings), replies are filled in before sending. A request is frozen:
    # the scheduler's stamps live in its own record (scheduling/queued.py)
    inboxes = set(SCHEDULER_INBOX) | set(FRONTEND_INBOX) | set(WORKER_INBOX)
    working = {ExecuteBatch, BatchDone, InferResponse, StatsReply,
               RegionReply, RepositoryReply, LogSettingsReply, TraceSettingReply}
    assert working <= inboxes
    for struct in inboxes - working:
        assert struct.__struct_config__.frozen, struct.__name__
    for struct in working:
        assert not struct.__struct_config__.frozen, struct.__name__
    update = ModelStateUpdate("m", 1, ModelReadyState.READY)
    with pytest.raises(AttributeError):
        update.state = ModelReadyState.UNAVAILABLE


def test_a_request_on_the_wire_carries_none_of_the_schedulers_state():
    # queue entry, trace and cache lookup are the scheduler's record's (Queued): the
    # worker gets the request as its requester sent it, and nobody can change it
    stamps = set(Queued.__struct_fields__) - {"req"}
    assert stamps == {"queue_ns", "cache_lookup_ns", "trace_id"}
    assert not stamps & set(InferRequest.__struct_fields__)
    req = InferRequest(1, "fe", "m", 0, [])
    with pytest.raises(AttributeError):
        req.batch_size = 2
