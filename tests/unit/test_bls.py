"""BLS and cancellation logic without processes: the scheduler's admission of BLS
requests (Triton's request checks, the call-chain rule), where it forwards a cancel,
and the worker's BLS client (responses matched to calls, tensors by reference, blocks
released once, decoupled iterators, async_exec on an event loop)."""

import asyncio
import gc
import threading
import types

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from scheduler import bls as admission
from scheduler.repository.models import ModelReadyState
from scheduler.scheduling.queued import Queued
from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter
from shm.arena import Arena
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import CancelRequest, InferRequest, RequestOrigin
from shm.messages.results import Error, InferResponse, ReleaseBlocks
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef
from workers.python_backend import pb_utils
from workers.python_backend.bls import BlsClient, Cancellations
from workers.tensors import Copies, TensorIO
from tests.unit.fake_callbacks import FakeCallbacks


def _config(max_batch_size=8, decoupled=False):
    cfg = model_config_pb2.ModelConfig(name="callee", max_batch_size=max_batch_size)
    cfg.input.add(name="X", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    cfg.input.add(name="OPT", data_type=model_config_pb2.TYPE_INT32, dims=[1],
                  optional=True)
    cfg.model_transaction_policy.decoupled = decoupled
    return cfg


def _bls_req(shape=(2, 4), datatype="FP32", callers=(), name="X", model="callee", rid=1):
    ref = TensorRef(name, datatype, list(shape), data=bytes(4 * int(np.prod(shape))))
    return InferRequest(rid, "ipc://worker", model, 0, [ref], origin=RequestOrigin.BLS,
                        callers=list(callers))


# -- admission --------------------------------------------------------------------


def _callee(config):
    """The callee's ModelVersion, as far as admission reads it."""
    return types.SimpleNamespace(scheduler=object(), state=ModelReadyState.READY,
                                 config=config)


def test_admit_derives_the_batch_size_from_the_callee_config():
    # Triton: the batch size is the first dimension where the model batches, else 1.
    # The request is frozen: admit returns it with the size the worker reads
    assert admission.admit(_bls_req((3, 4)), _callee(_config())).batch_size == 3
    assert admission.admit(_bls_req((3, 4)), _callee(_config(max_batch_size=0))
                           ).batch_size == 1
    # the origin marks a BLS call, not a batch size of 0: whatever size it carries
    # (the default 1 here) is the scheduler's to derive
    req = _bls_req((5, 4))
    assert req.batch_size == 1
    assert admission.check(req, _config()) == 5
    assert admission.admit(req, _callee(_config())).batch_size == 5


@pytest.mark.parametrize("req,text", [
    (_bls_req((9, 4)), "inference request batch-size must be <= 8 for 'callee'"),
    (_bls_req(name="Y"), "unexpected inference input 'Y' for model 'callee'"),
    (_bls_req(datatype="INT32"),
     "inference input 'X' data-type is 'INT32', but model 'callee' expects 'FP32'"),
    (_bls_req(name="OPT", datatype="INT32", shape=(1, 1)),
     "missing required input(s) ['X']"),
])
def test_admit_refuses_what_triton_refuses_with_its_words(req, text):
    # Triton core checks every request, BLS ones included, against the config
    with pytest.raises(InferError) as err:
        admission.check(req, _config())
    assert err.value.code == ErrorCode.INVALID_ARG and text in err.value.message


@pytest.mark.parametrize("callers", [["callee"], ["a", "callee", "b"]])
def test_admit_refuses_a_call_into_a_model_waiting_up_the_chain(callers):
    # a call back into a waiting execute would queue behind it for ever
    with pytest.raises(InferError) as err:
        admission.check(_bls_req(callers=callers), _config())
    assert " -> ".join([*callers, "callee"]) in err.value.message
    assert "would wait for itself" in err.value.message


def test_admit_lets_a_chain_without_the_callee_through():
    req = _bls_req(callers=["a", "b"])
    assert admission.check(req, _config()) == 2


# -- where a cancel goes ----------------------------------------------------------


def _scheduler(decoupled=False):
    sent = []
    limiter = RateLimiter()
    s = DynamicBatchScheduler("callee", 1, _config(decoupled=decoupled), limiter,
                              FakeCallbacks(lambda slot, b, _: sent.append(b)))
    slot = InstanceSlot("callee/1/c_0#1", "c_0", "KIND_CPU", 0)
    slot.worker = types.SimpleNamespace(address="ipc://worker-0")
    limiter.add(s, slot)
    return s, sent


def _done(batch):
    return BatchDone(batch.batch_id, batch.instance, 0, 1, 2, 3)


def test_a_running_request_is_found_on_its_worker_and_forgotten_when_done():
    s, sent = _scheduler()
    s.enqueue(Queued(InferRequest(7, "ipc://fe", "callee", 1, [], batch_size=1)), 0)
    s.pump(0)
    assert s.cancel("ipc://fe", 7, 0) is False  # not queued any more
    assert s.running_on("ipc://fe", 7) == "ipc://worker-0"
    assert s.running_on("ipc://other", 7) is None
    s.batch_done(_done(sent[0]), 0)
    assert s.running_on("ipc://fe", 7) is None


def test_a_decoupled_request_stays_reachable_after_its_batch():
    # its model may go on sending after execute returned: a cancel must still reach it
    s, sent = _scheduler(decoupled=True)
    s.enqueue(Queued(InferRequest(7, "ipc://fe", "callee", 1, [], batch_size=1)), 0)
    s.pump(0)
    s.batch_done(_done(sent[0]), 0)
    assert s.running_on("ipc://fe", 7) == "ipc://worker-0"


def test_cancellations_flag_only_tracked_requests():
    c = Cancellations()
    flag = c.track("ipc://fe", 1)
    assert not c.cancel("ipc://fe", 2)
    assert c.cancel("ipc://fe", 1) and flag.is_set()
    c.done("ipc://fe", 1)
    assert not c.cancel("ipc://fe", 1)


# -- the worker's BLS client ---------------------------------------------------------


class World:
    """A caller's BlsClient and a callee's arena in one process; the messages the
    client sends are captured instead of going to sockets."""

    def __init__(self, prefix):
        self.caller_arena = Arena(f"{prefix}-caller", chunk_size=1 << 20, prefault=False)
        self.callee_arena = Arena(f"{prefix}-callee", chunk_size=1 << 20, prefault=False)
        self.callee = TensorIO(self.callee_arena, "ipc://callee")
        self.io = TensorIO(self.caller_arena, "ipc://caller")
        self.client = BlsClient("ipc://caller", "ipc://scheduler", self.io)
        self.sent = []
        self.client._send_msg = lambda address, msg: self.sent.append((address, msg))
        self.client.model = "caller"
        self.client.receiver = None  # the test itself delivers the answers

    def answer(self, rid, array=None, final=True, empty=False, error=""):
        outputs = []
        if array is not None:
            outputs = self.callee.write([("Y", "FP32", array)], None, "ipc://caller",
                                        Copies())
        self.client.on_response(InferResponse(rid, outputs=outputs, final=final,
                                              owner="ipc://callee", empty=empty,
                                              error=Error(ErrorCode.INVALID_ARG, error)
                                              if error else None))

    def close(self):
        self.client.close()
        self.io.close()
        self.callee.close()
        self.caller_arena.close()
        self.callee_arena.close()


@pytest.fixture
def world(request, monkeypatch):
    w = World(f"shmserve-unit-bls-{threading.get_ident():x}-{request.node.name[-8:]}"
              .replace("[", "").replace("]", ""))
    # what the worker does at start: exec()/async_exec() go to its client
    monkeypatch.setattr(pb_utils, "_bls_executor", w.client.exec)
    monkeypatch.setattr(pb_utils, "_bls_async_executor", w.client.async_exec)
    yield w
    w.close()


def _request(x, model="callee"):
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor("X", x)],
                                     requested_output_names=["Y"])


def _in_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.update(result=fn()))
    t.start()
    return t, box


def _wait_sent(world, n):
    for _ in range(2000):
        if len(world.sent) >= n:
            return
        threading.Event().wait(0.005)
    raise AssertionError("nothing sent")


def test_exec_reads_outputs_in_place_and_releases_them_once_unused(world):
    # Rule: outputs are read where the callee wrote them; the block goes back to its
    # owner (one ReleaseBlocks) when the last array over it is gone
    x = np.arange(40_000, dtype=np.float32)  # > the inline limit: goes through arenas
    t, box = _in_thread(lambda: _request(x).exec())
    _wait_sent(world, 1)
    address, msg = world.sent[0]
    assert address == "ipc://scheduler" and isinstance(msg, InferRequest)
    assert msg.reply_to == "ipc://caller" and msg.callers == ["caller"]
    assert msg.origin is RequestOrigin.BLS and msg.inputs[0].data is None  # in our arena
    assert world.caller_arena.used_bytes() > 0
    world.answer(msg.id, x * 2)
    t.join(10)
    response = box["result"]
    assert world.caller_arena.used_bytes() == 0  # inputs freed at the final response
    y = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
    np.testing.assert_array_equal(y, x * 2)
    part = y[10:20]
    del response, y
    box.clear()
    gc.collect()
    assert not any(isinstance(m, ReleaseBlocks) for _, m in world.sent)  # `part` is alive
    del part
    gc.collect()
    releases = [(a, m) for a, m in world.sent if isinstance(m, ReleaseBlocks)]
    assert len(releases) == 1 and releases[0][0] == "ipc://callee"
    assert releases[0][1].reader == "ipc://caller"
    world.callee.released(releases[0][1].reader, releases[0][1].blocks)
    assert world.callee_arena.used_bytes() == 0


def test_an_input_of_the_running_request_is_passed_on_by_reference(world):
    # Rule: a tensor the model received is sent on as the descriptor it came in
    ref = TensorRef("X", "FP32", [4], segment="shmserve-frontend-0", offset=4096,
                    nbytes=16)
    tensor = pb_utils.Tensor._from_server("X", "FP32", np.zeros(4, np.float32))
    world.client.input_refs[id(tensor)] = (tensor, ref)
    call = pb_utils.InferenceRequest(model_name="callee", inputs=[tensor],
                                     requested_output_names=["Y"])
    t, box = _in_thread(call.exec)
    _wait_sent(world, 1)
    msg = world.sent[0][1]
    assert msg.inputs == [ref] and world.caller_arena.used_bytes() == 0
    world.answer(msg.id, error="bad input")
    t.join(10)
    err = box["result"].error()
    # Triton's python backend hands every BLS error to the model as INTERNAL
    assert err.message() == "bad input" and err.code() == ErrorCode.INTERNAL


def test_decoupled_exec_yields_each_response_until_the_final_one(world):
    # Rule: exec(decoupled=True) iterates the responses; the final empty one included
    it = _request(np.ones(4, np.float32)).exec(decoupled=True)
    rid = world.sent[0][1].id
    world.answer(rid, np.array([1.0], np.float32), final=False)
    world.answer(rid, np.array([2.0], np.float32), final=False)
    world.answer(rid, final=True, empty=True)
    got = [r.output_tensors()[0].as_numpy()[0] if r.output_tensors() else None for r in it]
    assert got == [1.0, 2.0, None]


def test_an_abandoned_decoupled_call_is_cancelled_and_its_blocks_released(world):
    # Rule: a model that stops iterating leaks nothing: the call is cancelled and what
    # still arrives is released to its owner
    it = _request(np.ones(4, np.float32)).exec(decoupled=True)
    rid = world.sent[0][1].id
    world.answer(rid, np.zeros(40_000, np.float32), final=False)
    next(it).output_tensors()  # read one, drop the rest
    del it
    gc.collect()
    assert ("ipc://scheduler", CancelRequest(rid, "ipc://caller")) in world.sent
    world.answer(rid, np.zeros(40_000, np.float32), final=True)
    for _, m in world.sent:
        if isinstance(m, ReleaseBlocks):
            world.callee.released(m.reader, m.blocks)
    assert world.callee_arena.used_bytes() == 0


def test_async_exec_is_awaited_on_the_running_loop(world):
    # Rule: async_exec returns an awaitable; several run at once (asyncio.gather)
    async def main():
        calls = [_request(np.full(4, i, np.float32)).async_exec() for i in range(3)]
        gathered = asyncio.gather(*calls)
        await asyncio.sleep(0)
        for address, msg in list(world.sent):
            # answered from another thread, as the worker's receiver does
            threading.Thread(target=world.answer,
                             args=(msg.id, np.full(2, msg.id, np.float32))).start()
        return await asyncio.wait_for(gathered, 10)

    responses = asyncio.run(main())
    ids = [m.id for _, m in world.sent if isinstance(m, InferRequest)]
    assert [r.output_tensors()[0].as_numpy()[0] for r in responses] == ids


def test_a_call_on_the_receiving_thread_is_refused_not_deadlocked(world):
    # initialize()/finalize() run on the thread that would have to deliver the answer
    world.client.receiver = threading.get_ident()
    with pytest.raises(pb_utils.TritonModelException, match="only be made from execute"):
        _request(np.ones(4, np.float32)).exec()
    assert world.sent == []


def test_close_fails_waiting_calls(world):
    # a stopping worker does not leave a model blocked in exec()
    t, box = _in_thread(lambda: _request(np.ones(4, np.float32)).exec())
    _wait_sent(world, 1)
    world.client.close()
    t.join(10)
    assert box["result"].error().message() == "the worker is stopping"
