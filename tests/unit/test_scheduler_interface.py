"""The loop's side of the scheduler interface (scheduling/interface.py), without
processes: a batching scheduler asks to be pumped when it takes a request and wakes
itself when it unloads, says what a slot runs (region quarantine reads it), and the
control calls reach their owners with enum operations that decode or fail."""

import asyncio

import msgspec
import pytest

from scheduler.regions import RegionRegistry
from scheduler.repository.control import ModelControl
from scheduler.scheduling.factory import create_scheduler
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from shm.errors import ErrorCode
from shm.messages.regions import SYSTEM, RegionOp, RegionRequest
from shm.messages.repository import RepositoryOp, RepositoryRequest
from shm.messages.results import Error
from tests.unit.fake_callbacks import FakeCallbacks
from tests.unit.test_dynamic_scheduler import _config as dynamic_config
from tests.unit.test_dynamic_scheduler import _req as dynamic_req
from tests.unit.test_regions import key, ref, register, request  # noqa: F401 (fixture)
from tests.unit.test_sequence_scheduler import _config as sequence_config
from tests.unit.test_sequence_scheduler import _req as sequence_req


def _scheduler(config, callbacks):
    limiter = RateLimiter()
    s = create_scheduler("m", 1, config, limiter, callbacks, environ={})
    slot = InstanceSlot("m/1/m_0_0#1", "m_0_0", "KIND_CPU", 0)
    limiter.add(s, slot)
    return s, slot


@pytest.mark.parametrize("config, req", [
    (dynamic_config(), lambda: dynamic_req(1)),
    (sequence_config(max_batch_size=1), lambda: sequence_req(1, start=True)),
])
def test_a_batching_scheduler_asks_to_be_pumped_and_says_what_its_slot_runs(config, req):
    """The loop pumps only the schedulers that ask (an ensemble never does): the one
    the loop knows, not a part of it; begin_unload wakes it once more."""
    callbacks = FakeCallbacks()
    s, slot = _scheduler(config, callbacks)
    r = req()
    s.enqueue(r, 0)
    assert callbacks.pumped == {s}
    s.pump(10**9)  # past any queue delay
    assert s.running(slot) == [r] and s.running_on(r.req.reply_to, r.req.id) is None  # no worker
    s.begin_unload()
    assert callbacks.woken == [s] and not s.accepting


def test_region_calls_are_answered_by_the_registry_and_quarantine_takes_the_region(key):
    """RegionRequest goes to RegionRegistry.on_call; a worker's SIGBUS unregisters the
    system regions its requests read (their clients' later requests fail)."""
    sent = []
    reg = RegionRegistry(True, 0, lambda region: None,
                         send=lambda to, reply: sent.append((to, reply)))
    reg.on_call(RegionRequest(7, "fe", RegionOp.REGISTER, SYSTEM, "r", key, 0, 4096))
    reg.on_call(RegionRequest(8, "fe", RegionOp.STATUS, SYSTEM, "r"))
    assert [(to, r.call_id, r.error) for to, r in sent] == [("fe", 7, None), ("fe", 8, None)]
    assert [s.name for s in sent[1][1].regions] == ["r"]
    user = request(1, ref("r"))
    reg.resolve(user)
    assert reg.quarantine([user, request(2)]) == ["r"]
    reg.on_call(RegionRequest(9, "fe", RegionOp.STATUS, SYSTEM, "r"))
    assert sent[-1][1].error.code == ErrorCode.NOT_FOUND


@pytest.mark.parametrize("struct, args", [
    (RegionRequest, (1, "fe", "bogus", SYSTEM)),
    (RepositoryRequest, (1, "fe", "bogus")),
])
def test_an_unknown_operation_does_not_decode(struct, args):
    """Operations are enums: a call with one the scheduler does not know is a protocol
    error at the inbox, not a guess."""
    wire = msgspec.msgpack.encode(struct(*args))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(wire, type=struct)
    good = msgspec.msgpack.decode(msgspec.msgpack.encode(struct(*args[:2], "index"
                                  if struct is RepositoryRequest else "status", *args[3:])),
                                  type=struct)
    assert isinstance(good.op, RepositoryOp if struct is RepositoryRequest else RegionOp)


def test_repository_calls_are_answered_by_model_control():
    """RepositoryRequest goes to ModelControl.on_call; while the server stops, every
    call is refused as Triton refuses it."""
    class Manager:
        stopping = True

    class Args:
        model_control_mode = "explicit"
        repository_poll_secs = 0

    sent = []

    async def call():
        control = ModelControl(Manager(), Args(), send=lambda to, r: sent.append((to, r)))
        control.on_call(RepositoryRequest(3, "fe", RepositoryOp.INDEX))
        await asyncio.gather(*control._calls)

    asyncio.run(call())
    ((to, reply),) = sent
    assert (to, reply.call_id, reply.error) == (
        "fe", 3, Error(ErrorCode.UNAVAILABLE, "Server is stopping"))
