"""The frontend's side of a lease (frontend/dataplane.py): what SchedulerDataPlane
sends where, and how it ends a request sent under a lease. The data plane is the real
one; its outbox records instead of sending."""

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from frontend.types import DecodedInput, DecodedRequest
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest, InferRequest, ModelStateUpdate
from shm.messages.leases import LeaseEnded, LeaseQueue
from shm.messages.regions import RegionShared, RegionUnshared
from shm.messages.repository import ModelReadyState
from shm.messages.results import InferResponse, PeerGone
from shm.messages.worker import ExecuteBatch
from tests.unit.recording_plane import run_with_plane

pytestmark = pytest.mark.timeout(30)

WORKER = "ipc://worker"


def config() -> bytes:
    c = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    c.input.add(name="IN", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    c.output.add(name="OUT", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    return c.SerializeToString()


def run(tmp_path, test):
    run_with_plane(tmp_path, test, config())


def request(region: str = "") -> DecodedRequest:
    if region:
        inp = DecodedInput("IN", "FP32", [1, 4], None,
                           {"shared_memory_region": region, "shared_memory_byte_size": 16})
    else:
        inp = DecodedInput("IN", "FP32", [1, 4], np.ones(4, np.float32).tobytes())
    return DecodedRequest("m", "", "", [inp], None, {})


def grant(plane, stream, lease: int = 7, depth: int = 1) -> None:
    """The answer to `stream`'s request, lending the instance."""
    plane.on_response(InferResponse(stream.rid, lease=(lease, "m_0", WORKER, depth)))


def last(plane):
    return plane.sent[-1]


def test_requests_go_to_the_worker_one_at_a_time_under_a_lease(tmp_path):
    async def test(plane):
        first = plane.start(request())
        assert last(plane)[0] == "ipc://sched" and isinstance(last(plane)[1], InferRequest)
        grant(plane, first)
        second = plane.start(request())
        to, msg = last(plane)
        assert to == WORKER and isinstance(msg, ExecuteBatch)
        assert (msg.direct, msg.lease, msg.instance, msg.quiet) == (True, 7, "m_0", True)
        assert msg.requests[0].id == second.rid
        third = plane.start(request())  # the lent instance is busy: the scheduler's
        assert last(plane)[0] == "ipc://sched"
        plane.on_response(InferResponse(second.rid))
        plane.on_response(InferResponse(third.rid))
        plane.start(request())
        assert last(plane)[0] == WORKER
        # a cancel of a request sent under the lease goes to the worker running it
        fourth = plane.start(request())  # (to the scheduler: the lease is busy)
        plane.pending[fourth.rid - 1].cancel()
        assert last(plane) == (WORKER, CancelRequest(fourth.rid - 1, plane.address))
    run(tmp_path, test)


def test_a_lease_ended_sends_requests_to_the_scheduler_again(tmp_path):
    async def test(plane):
        grant(plane, plane.start(request()))
        plane.on_lease_ended(LeaseEnded("m_0", 7))
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
        # an end heard before the grant it ends (another connection): never used
        plane.on_lease_ended(LeaseEnded("m_0", 8))
        grant(plane, plane.start(request()), lease=8)
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
        # a new state of the model: the lease is the scheduler's to give again
        grant(plane, plane.start(request()), lease=9)
        plane.on_model_state(ModelStateUpdate("m", 1, ModelReadyState.READY,
                                              config=config()))
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
    run(tmp_path, test)


async def _error_of(stream) -> InferError:
    result, final = await asyncio.wait_for(stream.next(), 5)
    assert final and isinstance(result, InferError)
    return result


def test_a_lost_instance_fails_the_request_sent_under_its_lease(tmp_path):
    async def test(plane):
        grant(plane, plane.start(request()))
        running = plane.start(request())
        plane.on_lease_ended(LeaseEnded("m_0", 7, lost=True, reason="it died"))
        error = await _error_of(running)
        assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "it died")
        assert running.rid not in plane.pending
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
    run(tmp_path, test)


def test_a_worker_that_stopped_fails_what_it_never_read(tmp_path):
    async def test(plane):
        grant(plane, plane.start(request()))
        running = plane.start(request())
        elsewhere = plane.start(request())  # with the scheduler: not this worker's
        plane.on_peer_gone(PeerGone(WORKER, "prefix-"))
        error = await _error_of(running)
        assert error.code == ErrorCode.UNAVAILABLE and "stopped" in error.message
        assert elsewhere.rid in plane.pending
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
    run(tmp_path, test)


def test_a_request_whose_lease_ended_unread_fails_if_its_worker_stops(tmp_path):
    """The lease ended before the worker read the request sent under it, and the
    worker stopped (an unload) before reading it: it fails when the worker is gone,
    instead of waiting for an answer nobody will send."""
    async def test(plane):
        grant(plane, plane.start(request()))
        unread = plane.start(request())
        assert last(plane)[0] == WORKER
        plane.on_lease_ended(LeaseEnded("m_0", 7))
        plane.on_peer_gone(PeerGone(WORKER, "prefix-"))
        error = await _error_of(unread)
        assert error.code == ErrorCode.UNAVAILABLE and "stopped" in error.message
        assert unread.rid not in plane.pending
    run(tmp_path, test)


def test_a_request_handed_on_is_the_schedulers(tmp_path):
    """The worker read it after the lease ended: it hands it on to the scheduler and
    says so (a second LeaseEnded); the worker's stop then does not fail it, its cancel
    goes to the scheduler, and the scheduler's answer ends it."""
    async def test(plane):
        grant(plane, plane.start(request()))
        handed = plane.start(request())
        plane.on_lease_ended(LeaseEnded("m_0", 7))
        plane.on_lease_ended(LeaseEnded("m_0", 7, request=handed.rid))  # the hand-on
        plane.on_peer_gone(PeerGone(WORKER, "prefix-"))
        assert handed.rid in plane.pending
        plane.on_response(InferResponse(handed.rid))
        result, final = await asyncio.wait_for(handed.next(), 5)
        assert final and not isinstance(result, InferError)
        assert handed.rid not in plane.pending

        # between the two ends, a cancel goes to the scheduler, which has it or will
        grant(plane, plane.start(request()), lease=8)
        pending = plane.start(request())
        plane.on_lease_ended(LeaseEnded("m_0", 8))
        pending.cancel()
        assert last(plane) == ("ipc://sched", CancelRequest(pending.rid, plane.address))
    run(tmp_path, test)


def test_region_names_are_resolved_here_under_a_lease(tmp_path):
    async def test(plane):
        plane.on_region_shared(RegionShared(3, "r", "system", "/key", 64, 128))
        grant(plane, plane.start(request()))
        plane.start(request("r"))
        to, msg = last(plane)
        assert to == WORKER
        ref = msg.requests[0].inputs[0]
        assert (ref.region, ref.segment, ref.offset, ref.region_name) == (3, "/key", 64, "r")
        plane.on_response(InferResponse(msg.requests[0].id))
        # a name this frontend does not know (unregistered): the scheduler answers it,
        # with the request as the client sent it
        plane.on_region_unshared(RegionUnshared("r"))
        plane.start(request("r"))
        to, msg = last(plane)
        assert to == "ipc://sched" and msg.inputs[0].region == -1
        assert msg.inputs[0].segment == "r"
        # out of the region's bounds: the scheduler's words, too
        plane.on_region_shared(RegionShared(4, "small", "system", "/key", 0, 8))
        plane.start(request("small"))
        assert last(plane)[0] == "ipc://sched"
    run(tmp_path, test)


def test_a_deep_lease_sends_up_to_its_depth_at_once(tmp_path):
    """A lease on an instance that runs each request alone takes the frontend's
    requests up to its depth at once; past it they go to the scheduler (which sends
    them on under the lease), and each answer makes room for the next. Those sent
    behind another wait at the worker as in a queue (`ahead`, their batch id their
    request id), and the scheduler's quiet inbox hears how many wait (LeaseQueue)."""
    async def test(plane):
        grant(plane, plane.start(request()), depth=3)
        quiet = plane.quiet_scheduler
        n = len(plane.sent)
        sent = [plane.start(request()) for _ in range(3)]
        batches = [m for to, m in plane.sent[n:] if to == WORKER]
        assert [(b.batch_id, b.ahead) for b in batches] == \
            [(sent[0].rid, False), (sent[1].rid, True), (sent[2].rid, True)]
        told = [m for to, m in plane.sent[n:] if to == quiet]
        assert told == [LeaseQueue("m_0", 7, 1), LeaseQueue("m_0", 7, 2)]
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
        plane.on_response(InferResponse(sent[1].rid))
        assert last(plane) == (quiet, LeaseQueue("m_0", 7, 1))
        plane.start(request())
        assert last(plane) == (quiet, LeaseQueue("m_0", 7, 2))
        assert plane.sent[-2][0] == WORKER
        for stream in (sent[0], sent[2]):
            plane.on_response(InferResponse(stream.rid))
        assert last(plane) == (quiet, LeaseQueue("m_0", 7, 0))
    run(tmp_path, test)


def test_a_lost_instance_fails_every_request_sent_under_its_deep_lease(tmp_path):
    async def test(plane):
        grant(plane, plane.start(request()), depth=4)
        sent = [plane.start(request()) for _ in range(3)]
        plane.on_response(InferResponse(sent[0].rid))  # answered before the loss
        plane.on_lease_ended(LeaseEnded("m_0", 7, lost=True, reason="it died"))
        for stream in sent[1:]:
            error = await _error_of(stream)
            assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "it died")
        assert not plane.pending
    run(tmp_path, test)


def test_each_request_handed_on_from_a_deep_lease_is_the_schedulers_alone(tmp_path):
    """The worker ended the lease with one of three requests run and two unread, which
    it hands on, naming each. Only those two become the scheduler's: if the worker
    then stops, the one it ran and has not answered yet fails, they do not. The
    worker's word for a request may also cross its word for the lease."""
    async def test(plane):
        grant(plane, plane.start(request()), depth=4)
        ran, first, second = (plane.start(request()) for _ in range(3))
        plane.on_lease_ended(LeaseEnded("m_0", 7, request=first.rid))  # crossed
        plane.on_lease_ended(LeaseEnded("m_0", 7))
        plane.on_lease_ended(LeaseEnded("m_0", 7, request=second.rid))
        plane.start(request())
        assert last(plane)[0] == "ipc://sched"
        plane.on_peer_gone(PeerGone(WORKER, "prefix-"))
        error = await _error_of(ran)
        assert error.code == ErrorCode.UNAVAILABLE and "stopped" in error.message
        assert first.rid in plane.pending and second.rid in plane.pending
        first.cancel()  # the scheduler's now: so is its cancel
        assert last(plane) == ("ipc://sched", CancelRequest(first.rid, plane.address))
    run(tmp_path, test)
