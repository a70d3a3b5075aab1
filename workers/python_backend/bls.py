"""BLS: a python model's `InferenceRequest(...).exec()` and `async_exec()`, and the
cancel flags `request.is_cancelled()` reads.

A BLS call is an InferRequest the worker sends to the scheduler with its own inbox as
`reply_to`; the scheduler treats it like a frontend's, and the callee's worker answers
straight back here. The worker's main thread is the receiver: it hands each response
to the call waiting for it (`on_response`) while the model's `execute` runs on the
instance thread, so a call never waits on the thread that must deliver its answer.

Tensors go by reference both ways. An input that is one of the caller's own inputs
is passed on as the descriptor it came in (nothing copied); any other input is written
once into this worker's arena (or inline, when small) and freed when the call's final
response arrives. Outputs are read in place from the callee's arena: each becomes a
numpy array over the block, and the block goes back to its owner (ReleaseBlocks) once
the last array over it is gone.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import queue
import threading
import weakref
from typing import Callable

import numpy as np

from shm import datatypes
from shm.channel import Outbox
from shm.errors import ErrorCode
from shm.messages.frontend import CancelRequest, InferRequest, RequestedOutput, RequestOrigin
from shm.messages.results import Error, InferResponse, ReleaseBlocks
from shm.tensor import TensorRef, arena_blocks
from workers.python_backend import pb_utils

_CLOSED = InferResponse(0, error=Error(ErrorCode.UNAVAILABLE, "the worker is stopping"))

# While a batch runs inline on the worker's receiving thread (workers/main.py:
# Worker.run_inline), nobody else receives. A model that waits for something that
# arrives by message (exec()'s answer, a decoupled call's next response, async_exec(),
# is_cancelled()) then receives for itself: pump(timeout_ms) takes one message, or
# none by the timeout, and handles it. None while no batch runs inline.
_pump: Callable[[int], None] | None = None
_PUMP_SLICE_MS = 5  # a pump waits this long at most, then looks again


def set_pump(pump: Callable[[int], None] | None) -> None:
    global _pump
    _pump = pump


def _wait_for(done: Callable[[], bool]) -> None:
    """Receive until `done()`, as long as a batch runs inline (then the receiving
    thread is back at its loop and delivers what is still to come)."""
    pump = _pump
    while pump is not None and not done():
        pump(_PUMP_SLICE_MS)
        pump = _pump


class CancelFlag:
    """Set once a CancelRequest for its request arrives; `is_set` is what
    `request.is_cancelled()` calls. A plain attribute, not a threading.Event: nobody
    waits on it, and an Event (a Condition and a lock) cost ~4 us per request."""

    __slots__ = ("cancelled",)

    def __init__(self):
        self.cancelled = False

    def is_set(self) -> bool:
        if not self.cancelled and _pump is not None:
            _pump(0)  # running inline: a cancel may be waiting to be received
        return self.cancelled


class Cancellations:
    """The requests this worker runs, each with the flag a CancelRequest sets.

    A request is tracked from when its batch starts until `execute` returns, or, for
    a decoupled model, until LIMIT newer requests have started (it may still be
    sending; the scheduler remembers as many)."""

    LIMIT = 4096

    def __init__(self):
        self._flags: collections.OrderedDict[tuple[str, int], CancelFlag] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def track(self, reply_to: str, request_id: int) -> CancelFlag:
        return self.track_many([(reply_to, request_id)])[0]

    def track_many(self, keys: list[tuple[str, int]]) -> list[CancelFlag]:
        """Flags for a batch's requests, (reply_to, id) each: one lock for the batch."""
        flags = [CancelFlag() for _ in keys]
        with self._lock:
            tracked = self._flags
            tracked.update(zip(keys, flags))
            while len(tracked) > self.LIMIT:
                tracked.popitem(last=False)
        return flags

    def done(self, reply_to: str, request_id: int) -> None:
        with self._lock:
            self._flags.pop((reply_to, request_id), None)

    def done_many(self, keys) -> None:
        with self._lock:
            pop = self._flags.pop
            for key in keys:
                pop(key, None)

    def cancel(self, reply_to: str, request_id: int) -> bool:
        with self._lock:
            flag = self._flags.get((reply_to, request_id))
        if flag is None:
            return False  # finished already: nothing to tell
        flag.cancelled = True
        return True


class _Call:
    """One BLS request in flight: its answers arrive on `answers` (or, for an
    async_exec that expects one answer, resolve `future` on its loop)."""

    __slots__ = ("id", "answers", "future", "loop", "blocks", "abandoned")

    def __init__(self, call_id: int):
        self.id = call_id
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        self.future: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.blocks: list[tuple[str, int]] = []  # our arena blocks holding its inputs
        self.abandoned = False


class BlsClient:
    """The worker's side of BLS: sends calls, matches responses, releases blocks."""

    def __init__(self, address: str, scheduler: str, io, outbox=None):
        self.address = address
        self.scheduler = scheduler
        self.io = io
        self.cancels = Cancellations()
        # the calling model and the models waiting on it (InferRequest.callers)
        self.model = ""
        self.callers: list[str] = []
        # id(Tensor) -> (Tensor, TensorRef) for the inputs of the batch being run
        self.input_refs: dict[int, tuple] = {}
        self.copies = None  # the instance's Copies, for inputs written here
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._lock = threading.Lock()  # the outbox: any thread may call or release
        self._outbox = Outbox() if outbox is None else outbox  # shm/transport.py's
        self._closed = False
        # the thread that receives answers (the worker's main thread): a call made on
        # it (from initialize() or finalize()) could never be answered
        self.receiver = threading.get_ident()

    # -- the model's side ------------------------------------------------------------

    def exec(self, request, decoupled: bool):
        call = self._send(request)
        if decoupled:
            return ResponseIterator(self, call)
        return self._single(call, self._wait(call))

    async def async_exec(self, request, decoupled: bool):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call = self._send(request, future)
        if _pump is not None:
            # an event loop the model runs inside an inline batch: poll for the answer
            # from the loop itself, which must keep running to take it
            _poll_until(loop, future)
        first = await future
        if decoupled:
            return ResponseIterator(self, call, first)
        return self._single(call, first)

    def _single(self, call: _Call, msg: InferResponse):
        """A non-decoupled call's one response (a decoupled callee's extra ones are
        released: exec() without decoupled=True cannot return them)."""
        result = self._response(msg)
        while not msg.final:
            msg = self._wait(call)
            self._release_outputs(msg)
        return result

    @staticmethod
    def _wait(call: _Call) -> InferResponse:
        _wait_for(lambda: not call.answers.empty())
        return call.answers.get()

    def _send(self, request, future: asyncio.Future | None = None) -> _Call:
        if self._closed:
            raise pb_utils.TritonModelException("the worker is stopping")
        if threading.get_ident() == self.receiver and _pump is None:
            raise pb_utils.TritonModelException(
                "BLS requests can only be made from execute() (or threads it starts), "
                "not from initialize() or finalize()")
        call = _Call(next(self._ids))
        if future is not None:  # set before sending: the answer may come at once
            call.future, call.loop = future, future.get_loop()
        refs = []
        try:
            for tensor in request.inputs():
                refs.append(self._input_ref(tensor, call))
        except BaseException:
            self.io.released(self.address, call.blocks)
            raise
        correlation = request.correlation_id()
        flags = request.flags()
        msg = InferRequest(
            call.id, self.address, request._model_name, max(request._model_version, 0),
            refs, outputs=None, request_id=request.request_id(),
            origin=RequestOrigin.BLS,  # the scheduler derives its batch size
            timeout_us=request.timeout(), sequence_id=correlation,
            sequence_start=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
            sequence_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
            parameters=json.loads(request.parameters()),
            callers=[*self.callers, self.model] if self.model else list(self.callers))
        wanted = request.requested_output_names()
        if wanted:
            msg.outputs = [RequestedOutput(name) for name in sorted(wanted)]
        self._calls[call.id] = call
        self._send_msg(self.scheduler, msg)
        return call

    def _input_ref(self, tensor, call: _Call) -> TensorRef:
        known = self.input_refs.get(id(tensor))
        if known is not None and known[0] is tensor:
            ref = known[1]
            if ref.region == 0 and ref.name == tensor.name():
                return ref  # the caller's own input, still in its block: pass it on
            if ref.region == 0:
                return TensorRef(tensor.name(), ref.datatype, ref.shape, ref.data,
                                 ref.segment, ref.offset, ref.nbytes)
        datatype = tensor._datatype
        if tensor.is_cpu():
            array = tensor._host_array()
        else:
            from shm.cuda import cupy
            array = cupy().from_dlpack(tensor)
        copies = self.copies
        if copies is None:
            from workers.tensors import Copies
            copies = self.copies = Copies()
        ref, = self.io.write([(tensor.name(), datatype, array)], None, self.address, copies)
        if ref.data is None:
            call.blocks.append((ref.segment, ref.offset))
        return ref

    def _response(self, msg: InferResponse):
        if msg.error is not None:
            # INTERNAL whatever the callee's code, as Triton 2.51's python backend
            # reports every BLS error (its message is the callee's, unchanged)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(msg.error.message))
        tensors = [self._output(ref, msg.owner) for ref in msg.outputs]
        response = pb_utils.InferenceResponse(tensors)
        if msg.parameters:
            response._parameters = json.dumps(msg.parameters)
        return response

    def _output(self, ref: TensorRef, owner: str):
        if ref.data is not None:
            array = datatypes.tensor_from_buffer(ref.datatype, ref.shape, ref.data)
            return pb_utils.Tensor._from_server(ref.name, ref.datatype, array)
        blocks = [(ref.segment, ref.offset)]
        view = self.io.segments.view(ref.segment, ref.offset, ref.nbytes)
        array = datatypes.tensor_from_buffer(ref.datatype, ref.shape, view)
        if ref.datatype == "BYTES":  # parsed into objects: the block is read
            self._release(owner, blocks)
        else:
            array = _Lease.wrap(array, lambda: self._release(owner, blocks))
        return pb_utils.Tensor._from_server(ref.name, ref.datatype, array)

    # -- the receiver's side ---------------------------------------------------------

    def on_response(self, msg: InferResponse) -> None:
        """Runs on the worker's receiving thread."""
        call = self._calls.get(msg.id)
        if call is None or call.abandoned:
            self._release_outputs(msg)
            if msg.final:
                self._finish(msg.id)
            return
        if msg.final:
            self._finish(msg.id)
        future = call.future
        if future is not None:
            call.future = None  # the first answer resolves it; later ones queue
            call.loop.call_soon_threadsafe(_resolve, future, msg)
        else:
            call.answers.put(msg)

    def _finish(self, call_id: int) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None and call.blocks:
            self.io.released(self.address, call.blocks)
            call.blocks = []

    def abandon(self, call: _Call) -> None:
        """The model dropped a decoupled call's iterator before its final response:
        cancel it and release whatever still arrives."""
        if call.id not in self._calls:
            return
        call.abandoned = True
        while True:
            try:
                self._release_outputs(call.answers.get_nowait())
            except queue.Empty:
                break
        self._send_msg(self.scheduler, CancelRequest(call.id, self.address))

    def _release_outputs(self, msg: InferResponse) -> None:
        blocks = arena_blocks(msg.outputs)
        if blocks and msg.owner:
            self._release(msg.owner, blocks)

    def _release(self, owner: str, blocks) -> None:
        if owner == self.address:
            self.io.released(self.address, blocks)
        else:
            self._send_msg(owner, ReleaseBlocks(self.address, blocks))

    def _send_msg(self, address: str, msg) -> None:
        with self._lock:
            if not self._closed:
                self._outbox.send(address, msg)

    def close(self) -> None:
        """The worker stops: every waiting call gets an error."""
        for call in list(self._calls.values()):
            if call.future is not None:
                call.loop.call_soon_threadsafe(_resolve, call.future, _CLOSED)
            else:
                call.answers.put(_CLOSED)
        self._calls.clear()
        with self._lock:
            self._closed = True
            self._outbox.close()


def _poll_until(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    def poll():
        pump = _pump
        if future.done():
            return
        if pump is None:  # the batch ended: the receiving thread delivers it
            return
        pump(0)
        loop.call_later(0.0005, poll)
    loop.call_soon(poll)


def _resolve(future: asyncio.Future, msg: InferResponse) -> None:
    if not future.done():
        future.set_result(msg)


class ResponseIterator:
    """The responses of a BLS call to a decoupled model, as Triton's python backend
    yields them: each one as it arrives, the last marked final (an empty response
    when the model finished with send(None, FINAL))."""

    def __init__(self, client: BlsClient, call: _Call, first: InferResponse | None = None):
        self._client, self._call, self._first, self._done = client, call, first, False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        msg, self._first = self._first, None
        if msg is None:
            msg = self._client._wait(self._call)
        if msg.final:
            self._done = True
        return self._client._response(msg)

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._client.abandon(self._call)

    def __del__(self):
        if not self._done:
            try:
                self._client.abandon(self._call)
            except Exception:
                pass


class _Lease:
    """Presents an array over another process's block to numpy, so that every array
    derived from it keeps the lease alive; when the last one goes, `release` runs."""

    __slots__ = ("__array_interface__", "_array", "__weakref__")

    @classmethod
    def wrap(cls, array: np.ndarray, release) -> np.ndarray:
        lease = cls()
        lease._array = array
        lease.__array_interface__ = array.__array_interface__
        weakref.finalize(lease, release)
        return np.asarray(lease)
